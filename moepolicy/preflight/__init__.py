"""``moepolicy validate POLICY --live``: the policy's DeepEP settings through real DeepEP, before serving.

At the policy's EP size, on the GPUs visible (ranks placed round robin, ``measure.placement``), every
rank makes DeepEP's intranode ``Buffer`` with the policy's NVLink buffer size and, for every token
bucket, builds the bucket's dispatch and combine ``Config``s and dispatches every distinct wire format
the policy's layers send (``reference.payloads``). A case passes when DeepEP accepts the buffer and the
configs (its host asserts), every rank receives exactly the rows, scales, top-k experts and weights
the reference transport's semantics say it receives (``reference.transport.receive`` over the same
senders' inputs, compared byte for byte), and combine returns each token summed over the ranks it
went to. Every step has a deadline: a hung collective ends all ranks with a line naming the step.

This checks function, not speed: where ranks share a GPU nothing here is a measurement.
"""

from moepolicy.preflight.plan import (
    PreflightPlan,
    PreflightReport,
    describe_failure,
    plan_preflight,
    render,
)
from moepolicy.preflight.run import run_preflight

__all__ = [
    "PreflightPlan",
    "PreflightReport",
    "describe_failure",
    "plan_preflight",
    "render",
    "run_preflight",
]
