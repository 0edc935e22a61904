"""The fault campaign (``leaseworker chaos``): run a job under random faults, check the history.

``_campaign_records`` the campaign's own witnesses (triggers sent, offsets committed,
dead letters, stored completions, pod exits); ``_checker`` the invariants
judged over the pods' recorded history and those records (``_effect_checks``
the effects'; ``_invariant_verdict`` what each returns); ``_outside_checker``
the same store operations judged by Porcupine; ``_report`` the
printed, JSON and HTML report; ``_campaign_run`` the campaign itself; ``_takeover`` the takeover
trials of a CPU-bound job on two pods. Sits between
the tools' CLI and the local services (an import contract): it starts
services and pods through ``_services``.
"""

from ._campaign_records import DeadLetter as DeadLetter
from ._campaign_records import Marked as Marked
from ._campaign_records import PodExit as PodExit
from ._campaign_records import Produced as Produced
from ._campaign_records import Records as Records
from ._campaign_records import Stored as Stored
from ._campaign_run import Interrupted as Interrupted
from ._campaign_run import Settings as Settings
from ._campaign_run import run_campaign as run_campaign
from ._checker import RULES as RULES
from ._checker import check as check
from ._invariant_verdict import Verdict as Verdict
from ._outside_checker import available as outside_available
from ._outside_checker import operations as outside_operations
from ._outside_checker import outside_verdict as outside_verdict
from ._payloads import load_generator as load_generator
from ._report import render as render
from ._report import to_html as to_html
from ._report import to_json as to_json
from ._takeover import Trial as Trial
from ._takeover import Where as Where
from ._takeover import ahead as ahead
from ._takeover import takeover_trials as takeover_trials

__all__ = [
    "RULES",
    "DeadLetter",
    "Interrupted",
    "Marked",
    "PodExit",
    "Produced",
    "Records",
    "Settings",
    "Stored",
    "Trial",
    "Verdict",
    "Where",
    "ahead",
    "check",
    "load_generator",
    "outside_available",
    "outside_operations",
    "outside_verdict",
    "render",
    "run_campaign",
    "takeover_trials",
    "to_html",
    "to_json",
]
