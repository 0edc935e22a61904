// Command porcupine judges a fault campaign's store operations with Porcupine.
//
// It reads a "leaseworker.ops/1" document (what the campaign writes) on standard input:
// one JSON object per line, the first {"format": "leaseworker.ops/1"}, then one
// operation a line:
//
//	{"key": "k", "client": 3, "op": "complete", "version": "v1", "fence": 12,
//	 "call": 1000, "return": 2000, "status": "accepted"}
//
// "op" is "claim" or "complete"; "call" and "return" are CLOCK_MONOTONIC
// nanoseconds; a missing "return" (null) is an outcome never seen, open to
// the end of the history; a missing "status" is an answer never seen.
//
// The model is one job key of the completion store: the highest fence seen
// (accepted or claimed) and the versions completed. A complete of a version
// already completed answers duplicate whatever its fence; else a fence below
// the highest answers stale; else it is accepted and its fence becomes the
// highest. A claim raises the highest fence to its own whatever the answer.
//
// Prints one JSON line: {"linearizable": bool, "keys": n, "operations": n,
// "illegal": [keys], "unknown": [keys]}. Exit status 0 when every key is
// linearizable, 1 when one is not or was not decided in time, 2 on bad input.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

const format = "leaseworker.ops/1"

type record struct {
	Format  string  `json:"format"`
	Key     string  `json:"key"`
	Client  int     `json:"client"`
	Op      string  `json:"op"`
	Version string  `json:"version"`
	Fence   int64   `json:"fence"`
	Call    int64   `json:"call"`
	Return  *int64  `json:"return"`
	Status  *string `json:"status"`
}

type input struct {
	op      string
	version string
	fence   int64
}

// state is comparable: the highest fence and the completed versions, sorted, one a line.
type state struct {
	high int64
	done string
}

func completed(s state, version string) bool {
	if s.done == "" {
		return false
	}
	for _, v := range strings.Split(s.done, "\n") {
		if v == version {
			return true
		}
	}
	return false
}

func withDone(s state, version string) string {
	versions := []string{version}
	if s.done != "" {
		versions = append(versions, strings.Split(s.done, "\n")...)
	}
	sort.Strings(versions)
	return strings.Join(versions, "\n")
}

func step(st interface{}, in interface{}, out interface{}) (bool, interface{}) {
	s := st.(state)
	i := in.(input)
	answer := out.(string) // "" when the answer was never seen
	if i.op == "claim" {
		if s.high < i.fence {
			s.high = i.fence
		}
		if answer == "" {
			return true, s
		}
		// The claim is recorded whatever it answers; its answer follows the same rule.
		before := st.(state)
		want := "claimed"
		if completed(before, i.version) {
			want = "duplicate"
		} else if i.fence < before.high {
			want = "stale"
		}
		return answer == want, s
	}
	var want string
	switch {
	case completed(s, i.version):
		want = "duplicate"
	case i.fence < s.high:
		want = "stale"
	default:
		want = "accepted"
	}
	if answer != "" && answer != want {
		return false, s
	}
	if want == "accepted" {
		s = state{high: i.fence, done: withDone(s, i.version)}
	}
	return true, s
}

var model = porcupine.Model{
	Init: func() interface{} { return state{high: -1} },
	Step: step,
	DescribeOperation: func(in interface{}, out interface{}) string {
		i := in.(input)
		return fmt.Sprintf("%s(%q, fence %d) -> %q", i.op, i.version, i.fence, out.(string))
	},
}

func read(r io.Reader) (map[string][]porcupine.Operation, error) {
	keys := map[string][]porcupine.Operation{}
	scanner := bufio.NewScanner(r)
	scanner.Buffer(make([]byte, 1<<20), 1<<20)
	line := 0
	for scanner.Scan() {
		text := strings.TrimSpace(scanner.Text())
		if text == "" {
			continue
		}
		line++
		var rec record
		if err := json.Unmarshal([]byte(text), &rec); err != nil {
			return nil, fmt.Errorf("line %d: %v", line, err)
		}
		if line == 1 {
			if rec.Format != format {
				return nil, fmt.Errorf("not a %s document", format)
			}
			continue
		}
		if rec.Op != "claim" && rec.Op != "complete" {
			return nil, fmt.Errorf("line %d: op must be claim or complete, got %q", line, rec.Op)
		}
		ret := int64(math.MaxInt64)
		if rec.Return != nil {
			ret = *rec.Return
		}
		if ret < rec.Call {
			return nil, fmt.Errorf("line %d: returns before its call", line)
		}
		answer := ""
		if rec.Status != nil {
			answer = *rec.Status
		}
		keys[rec.Key] = append(keys[rec.Key], porcupine.Operation{
			ClientId: rec.Client,
			Input:    input{op: rec.Op, version: rec.Version, fence: rec.Fence},
			Call:     rec.Call,
			Output:   answer,
			Return:   ret,
		})
	}
	if err := scanner.Err(); err != nil {
		return nil, err
	}
	if line == 0 {
		return nil, fmt.Errorf("not a %s document: empty", format)
	}
	return keys, nil
}

type verdict struct {
	Linearizable bool     `json:"linearizable"`
	Keys         int      `json:"keys"`
	Operations   int      `json:"operations"`
	Illegal      []string `json:"illegal"`
	Unknown      []string `json:"unknown"`
}

func main() {
	timeout := flag.Duration("timeout", 60*time.Second, "how long one key may be searched")
	flag.Parse()
	keys, err := read(os.Stdin)
	if err != nil {
		fmt.Fprintf(os.Stderr, "porcupine: %v\n", err)
		os.Exit(2)
	}
	names := make([]string, 0, len(keys))
	for key := range keys {
		names = append(names, key)
	}
	sort.Strings(names)
	v := verdict{Keys: len(names), Illegal: []string{}, Unknown: []string{}}
	for _, key := range names {
		v.Operations += len(keys[key])
		switch porcupine.CheckOperationsTimeout(model, keys[key], *timeout) {
		case porcupine.Illegal:
			v.Illegal = append(v.Illegal, key)
		case porcupine.Unknown:
			v.Unknown = append(v.Unknown, key)
		}
	}
	v.Linearizable = len(v.Illegal) == 0 && len(v.Unknown) == 0
	out, _ := json.Marshal(v)
	fmt.Println(string(out))
	if !v.Linearizable {
		os.Exit(1)
	}
}
