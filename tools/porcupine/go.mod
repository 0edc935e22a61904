module leaseworker/tools/porcupine

go 1.24.6

require github.com/anishathalye/porcupine v1.3.1
