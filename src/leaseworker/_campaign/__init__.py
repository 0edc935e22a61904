"""The fault campaign (``leaseworker chaos``): run a job under random faults, check the history.

``_records`` the campaign's own witnesses (triggers sent, offsets committed,
dead letters, stored completions, pod exits); ``_checker`` the invariants
judged over the pods' recorded history and those records; ``_report`` the
printed, JSON and HTML report. Sits between the CLI and the dev services
(an import contract): it starts local services and pods through ``_dev``.
"""

from ._checker import RULES as RULES
from ._checker import Verdict as Verdict
from ._checker import check as check
from ._records import DeadLetter as DeadLetter
from ._records import PodExit as PodExit
from ._records import Produced as Produced
from ._records import Records as Records
from ._records import Stored as Stored

__all__ = [
    "RULES",
    "DeadLetter",
    "PodExit",
    "Produced",
    "Records",
    "Stored",
    "Verdict",
    "check",
]
