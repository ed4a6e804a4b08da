"""Which expert kernel, with which order, makes a rank's MoE step fastest: the step is the rank's
own compute (its sender quantization and expert stage, from an :class:`~moepolicy.tuning.
expert_bench.ExpertBench`) plus the communication of the arm's wire (dispatch and combine, from a
:class:`Communication` source), per token bucket.

The protocol (``measure.rounds``): the rounds are split, alternately, into **decide** rounds and
**report** rounds. Verdicts come from the decide rounds only, with the exact paired sign-flip test
and Holm's correction over the buckets; every figure printed or written comes from the report
rounds, which decided nothing. Communication from a model enters adversarially: the contender's
dispatch is raised by the model's error and the baseline's lowered (the combine is bf16 in every
order: the same op either way), so a verdict never rests on the model being right. Where no communication figure exists (outside the model's range), an order is
still claimed one way only: quantizing first puts half the bytes on the wire (fp8 with 1x128 scales
against bf16), so where its compute is faster beyond noise, its step is too; the other way needs the
communication and is not claimed.

The kernel gate: another kernel replaces the engine's pick only where its step, at its faster
order, is faster beyond noise on the weighted buckets and slower at none; where the engine's pick
could not be measured here nothing is claimed against it (``faster_kernel`` stays ``unmeasured``).

A modelled bench (noise-free) answers with one figure and an error instead of rounds: a verdict
needs the difference to exceed the errors of both sides.

Nothing here imports the planner or the document: it returns a ``schema.measured.ExpertChoice``.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from moepolicy.measure.rounds import holm, paired_speedup, weighted_rounds
from moepolicy.measure.routing import ExpertShape
from moepolicy.names import UNMEASURED
from moepolicy.schema.measured import ArmTiming, ExpertChoice, KernelTest, OrderTiming
from moepolicy.tuning.expert_bench import KERNEL_ORDERS, ExpertBench, arm_name

QTD, DTQ = "quant_then_dispatch", "dispatch_then_quant"
WIRE_OF_ORDER = {QTD: "fp8", DTQ: "bf16", "no_quant": "bf16"}
LEAST_ROUNDS = 12  # 6 decide + 6 report: the fewest with a 95 % interval in each half


@dataclass(frozen=True)
class Communication:
    """One wire's dispatch and combine at one bucket, per rank (us), with its relative error."""

    dispatch_us: float
    combine_us: float
    error: float = 0.0

    @property
    def total_us(self) -> float:
        return self.dispatch_us + self.combine_us


# (tokens, wire) -> the figure, or None outside the source's range
CommunicationOf = Callable[[int, str], Optional[Communication]]


@dataclass(frozen=True)
class ChoiceInputs:
    """What the choice is made for."""

    shape: ExpertShape
    buckets: tuple[tuple[int, float], ...]  # (tokens per rank, weight)
    engine_default: str  # the engine's own pick for these layers
    candidates: tuple[str, ...]  # kernels the engine can build for them on this GPU
    rounds: int = 16
    communication_words: str = ""  # where the communication figures come from
    seed: int = 0


def _median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))


def _halves(xs: Sequence[float]) -> tuple[list[float], list[float]]:
    """Decide rounds (even) and report rounds (odd): both spread over the whole run."""
    return list(xs[0::2]), list(xs[1::2])


@dataclass(frozen=True)
class _Bucket:
    tokens: int
    weight: float
    compute: dict[str, list[float]]  # arm -> per-round compute (one value when modelled)
    error: float  # the expert bench's relative error (0 measured)
    comm: dict[str, Optional[Communication]]  # wire -> figure


def _step(b: _Bucket, arm: str, rounds: Sequence[float], comm_scale: float = 0.0) -> list[float]:
    """Per-round step of ``arm``: compute + its wire's communication (raised by ``comm_scale``
    times the model's error; 0 for the point figure)."""
    c = b.comm.get(WIRE_OF_ORDER[arm.split("/", 1)[1]])
    # the combine is bf16 in every order: the same op either way, so the model's error is the
    # dispatch's (the one that differs between wires)
    extra = 0.0 if c is None else c.dispatch_us * (1 + comm_scale * c.error) + c.combine_us
    return [x + extra for x in rounds]


def _has_comm(b: _Bucket, *arms: str) -> bool:
    return all(b.comm.get(WIRE_OF_ORDER[a.split("/", 1)[1]]) is not None for a in arms)


def _same_wire(*arms: str) -> bool:
    return len({WIRE_OF_ORDER[a.split("/", 1)[1]] for a in arms}) == 1


class _Chooser:
    def __init__(self, inputs: ChoiceInputs, bench: ExpertBench, buckets: list[_Bucket]):
        self.inputs, self.bench, self.buckets = inputs, bench, buckets
        self.modelled = bench.noise_free

    # --- one comparison at one bucket: contender vs baseline ------------------------------------
    def _measured_test(self, b: _Bucket, contender: str, baseline: str, sign: int, half: int):
        """The paired test on one half of the rounds (0 decide, 1 report). ``sign`` +1: the
        contender's communication raised and the baseline's lowered (a claim that it is faster);
        -1 the other way (a claim that it is slower); 0: point figures (the report)."""
        c_rounds = _halves(b.compute[contender])[half]
        b_rounds = _halves(b.compute[baseline])[half]
        if _has_comm(b, contender, baseline) and not _same_wire(contender, baseline):
            c_step, b_step = (
                _step(b, contender, c_rounds, sign),
                _step(b, baseline, b_rounds, -sign),
            )
        else:  # the same wire (its communication cancels) or none: compute alone
            c_step, b_step = c_rounds, b_rounds
        return paired_speedup(b_step, c_step, self.inputs.seed, (contender, baseline))

    def _modelled_bounds(self, b: _Bucket, arm: str, sign: int, with_comm: bool) -> float:
        x = b.compute[arm][0] * (1 + sign * b.error)
        if with_comm:
            c = b.comm[WIRE_OF_ORDER[arm.split("/", 1)[1]]]
            x += c.dispatch_us * (1 + sign * c.error) + c.combine_us
        return x

    def _modelled_verdict(self, b: _Bucket, contender: str, baseline: str, one_way: bool) -> str:
        with_comm = _has_comm(b, contender, baseline) and not _same_wire(contender, baseline)
        if self._modelled_bounds(b, contender, +1, with_comm) < self._modelled_bounds(
            b, baseline, -1, with_comm
        ):
            return "faster"
        if not one_way and self._modelled_bounds(b, contender, -1, with_comm) > (
            self._modelled_bounds(b, baseline, +1, with_comm)
        ):
            return "slower"
        return "within noise"

    def point(self, b: _Bucket, arm: str) -> tuple[float, Optional[float]]:
        """The report figure of ``arm`` at ``b``: compute median and step median (None without
        communication)."""
        rounds = _halves(b.compute[arm])[1] if not self.modelled else b.compute[arm]
        compute = _median(rounds)
        if not _has_comm(b, arm):
            return compute, None
        return compute, _median(_step(b, arm, rounds))

    def figure(self, b: _Bucket, arm: str) -> float:
        compute, step = self.point(b, arm)
        return compute if step is None else step

    # --- the orders of one kernel ---------------------------------------------------------------
    def orders(self, kernel: str) -> tuple[tuple[OrderTiming, ...], str]:
        """Both orders of ``kernel`` at every bucket, each with its verdict, and the basis."""
        qtd, dtq = arm_name(kernel, QTD), arm_name(kernel, DTQ)
        comm_everywhere = all(_has_comm(b, qtd, dtq) for b in self.buckets)
        one_way = not comm_everywhere  # without communication only quantizing first is claimed
        basis = self._basis(comm_everywhere)
        if self.modelled:
            verdicts = [self._modelled_verdict(b, qtd, dtq, one_way) for b in self.buckets]
            correction = ""
        else:
            faster = holm(
                [self._measured_test(b, qtd, dtq, +1, 0) for b in self.buckets],
                side="faster",
                family="buckets",
            )
            slower = (
                [None] * len(self.buckets)
                if one_way
                else holm(
                    [self._measured_test(b, qtd, dtq, -1, 0) for b in self.buckets],
                    side="slower",
                    family="buckets",
                )
            )
            verdicts = [
                "faster"
                if f.faster
                else "slower"
                if (s is not None and s.slower)
                else "within noise"
                for f, s in zip(faster, slower)
            ]
            correction = faster[0].correction
        out = []
        for b, verdict in zip(self.buckets, verdicts):
            q_compute, q_step = self.point(b, qtd)
            d_compute, d_step = self.point(b, dtq)
            q, d = (q_step, d_step) if comm_everywhere else (q_compute, d_compute)
            report = None if self.modelled else self._measured_test(b, qtd, dtq, 0, 1)
            out.append(
                OrderTiming(
                    tokens=b.tokens,
                    quant_then_dispatch_us=round(q, 2),
                    dispatch_then_quant_us=round(d, 2),
                    rounds=0 if self.modelled else report.rounds,
                    speedup=round(d / q, 4) if self.modelled else round(report.speedup, 4),
                    ci95=None
                    if self.modelled or report.low is None
                    else (round(report.low, 4), round(report.high, 4)),
                    verdict=QTD
                    if verdict == "faster"
                    else DTQ
                    if verdict == "slower"
                    else UNMEASURED,
                    correction=correction,
                    basis=basis,
                )
            )
        return tuple(out), basis

    def _basis(self, comm_everywhere: bool) -> str:
        compute = self.bench.describe()
        if comm_everywhere:
            return f"{compute}; communication {self.inputs.communication_words}"
        return (
            f"{compute}; no communication figure for this target "
            f"({self.inputs.communication_words}): the times are compute only, and only quantizing "
            "first can be claimed (it puts half the bytes on the wire)"
        )

    # --- the kernel gate ------------------------------------------------------------------------
    def best_arm(self, kernel: str, b: _Bucket) -> str:
        """The kernel's faster order at ``b`` by the decide rounds (or the model's figure)."""
        arms = [arm_name(kernel, o) for o in KERNEL_ORDERS[kernel]]
        if len(arms) == 1:
            return arms[0]

        def decide_step(arm: str) -> float:
            rounds = b.compute[arm] if self.modelled else _halves(b.compute[arm])[0]
            return _median(_step(b, arm, rounds))

        return min(arms, key=decide_step)

    def kernel_test(self, contender: str, baseline: str) -> tuple[bool, tuple[KernelTest, ...]]:
        c_arms = [self.best_arm(contender, b) for b in self.buckets]
        b_arms = [self.best_arm(baseline, b) for b in self.buckets]
        if not all(
            _has_comm(b, c, d) or _same_wire(c, d) for b, c, d in zip(self.buckets, c_arms, b_arms)
        ):
            return False, ()
        if self.modelled:
            verdicts = [
                self._modelled_verdict(b, c, d, False)
                for b, c, d in zip(self.buckets, c_arms, b_arms)
            ]
            tests = tuple(
                KernelTest(b.tokens, c, d, v, round(self.figure(b, d) / self.figure(b, c), 4))
                for b, c, d, v in zip(self.buckets, c_arms, b_arms, verdicts)
            )
            wins = all(v != "slower" for v in verdicts) and any(v == "faster" for v in verdicts)
            return wins, tests
        per_bucket = [
            self._measured_test(b, c, d, +1, 0) for b, c, d in zip(self.buckets, c_arms, b_arms)
        ]
        slower = holm(
            [self._measured_test(b, c, d, -1, 0) for b, c, d in zip(self.buckets, c_arms, b_arms)],
            side="slower",
            family="buckets",
        )
        weights = [b.weight for b in self.buckets]

        def weighted(arms: list[str], half: int, sign: int) -> list[float]:
            return weighted_rounds(
                [
                    _step(b, a, _halves(b.compute[a])[half], sign)
                    for b, a in zip(self.buckets, arms)
                ],
                weights,
            )

        decide = paired_speedup(
            weighted(b_arms, 0, -1),
            weighted(c_arms, 0, +1),
            self.inputs.seed,
            (contender, baseline),
        )
        report = paired_speedup(
            weighted(b_arms, 1, 0), weighted(c_arms, 1, 0), self.inputs.seed, (contender, baseline)
        )
        tests = [
            KernelTest(
                b.tokens,
                c,
                d,
                "slower" if s.slower else ("faster" if t.faster else "within noise"),
                round(self._measured_test(b, c, d, 0, 1).speedup, 4),
                correction=s.correction,
            )
            for b, c, d, t, s in zip(self.buckets, c_arms, b_arms, per_bucket, slower)
        ]
        tests.append(
            KernelTest(
                0,
                contender,
                baseline,
                decide.verdict,
                round(report.speedup, 4),
                None if report.low is None else (round(report.low, 4), round(report.high, 4)),
            )
        )
        wins = decide.faster and not any(s.slower for s in slower)
        return wins, tuple(tests)

    # --- what the report shows -------------------------------------------------------------------
    def arms(self, kernels: Sequence[str]) -> tuple[tuple[int, tuple[ArmTiming, ...]], ...]:
        out = []
        for b in self.buckets:
            timings = []
            for kernel in kernels:
                for order in KERNEL_ORDERS[kernel]:
                    arm = arm_name(kernel, order)
                    compute, _ = self.point(b, arm)
                    c = b.comm.get(WIRE_OF_ORDER[order])
                    timings.append(
                        ArmTiming(
                            kernel,
                            order,
                            round(compute, 2),
                            None if c is None else round(c.dispatch_us, 2),
                            None if c is None else round(c.combine_us, 2),
                        )
                    )
            out.append((b.tokens, tuple(timings)))
        return tuple(out)


def choose_experts(
    inputs: ChoiceInputs, bench: ExpertBench, communication: CommunicationOf
) -> ExpertChoice:
    """The expert-kernel comparison for one target: see the module's doc."""
    statuses = bench.kernels(inputs.candidates)
    measured = [s.kernel for s in statuses if s.runs and s.kernel in KERNEL_ORDERS]
    problems = [p for t, _ in inputs.buckets if (p := bench.problem(inputs.shape, t)) is not None]
    source = bench.source
    if not measured or problems:
        why = (
            problems[0]
            if problems
            else "no expert kernel the engine can build here could be timed: "
            + "; ".join(f"{s.kernel}: {s.detail}" for s in statuses)
        )
        return ExpertChoice(
            inputs.engine_default,
            UNMEASURED,
            source,
            bench.describe(),
            f"{why}; the engine's pick ({inputs.engine_default}) is kept",
            kernels=statuses,
        )
    if not bench.noise_free and inputs.rounds < LEAST_ROUNDS:
        raise ValueError(
            f"rounds: the expert-stage comparison needs at least {LEAST_ROUNDS} rounds (half decide, "
            f"half report, 6 each for a 95 % interval), got {inputs.rounds}"
        )
    arms = [arm_name(k, o) for k in measured for o in KERNEL_ORDERS[k]]
    buckets = []
    for tokens, weight in inputs.buckets:
        times = bench.times(inputs.shape, tokens, arms, inputs.rounds)
        comm = {wire: communication(tokens, wire) for wire in ("fp8", "bf16")}
        buckets.append(_Bucket(tokens, weight, times.per_round, times.error, comm))
    chooser = _Chooser(inputs, bench, buckets)
    orders, bases = [], []
    for kernel in measured:
        if len(KERNEL_ORDERS[kernel]) == 2:
            timings, basis = chooser.orders(kernel)
            orders.append((kernel, timings))
            bases.append(basis)
    faster_kernel, tests, why = _gate(chooser, inputs, measured, statuses)
    basis = bases[0] if bases else bench.describe()
    if bench.noise_free:  # a model's figures carry its error, said with them
        errors = [100 * b.error for b in buckets]
        basis += f"; the expert-stage model's error at these buckets: {min(errors):.0f}-{max(errors):.0f} %"
    return ExpertChoice(
        engine_default=inputs.engine_default,
        faster_kernel=faster_kernel,
        source=source,
        basis=basis,
        why=why,
        kernels=statuses,
        arms=chooser.arms(measured),
        orders=tuple(orders),
        tests=tests,
        rounds=0 if bench.noise_free else len(_halves(range(inputs.rounds))[1]),
    )


def _gate(chooser: _Chooser, inputs: ChoiceInputs, measured: list[str], statuses):
    default = inputs.engine_default
    if default not in measured:
        detail = next((s.detail for s in statuses if s.kernel == default), "not a candidate here")
        return (
            UNMEASURED,
            (),
            f"{default} (the engine's pick) was not measured here ({detail}): nothing is claimed "
            "against it, and it is kept unless another kernel is asked for",
        )
    best, best_tests = None, ()
    for kernel in measured:
        if kernel == default:
            continue
        wins, tests = chooser.kernel_test(kernel, default)
        if wins and (best is None or _weighted_speedup(tests) > _weighted_speedup(best_tests)):
            best, best_tests = kernel, tests
        elif best is None and not best_tests:
            best_tests = tests
    if best is None:
        return (
            UNMEASURED,
            best_tests,
            f"no kernel's MoE step was faster beyond noise than {default} (the engine's pick) at "
            "the weighted buckets without being slower at one: it is kept",
        )
    return (
        best,
        best_tests,
        f"{best}'s MoE step was faster beyond noise than {default} (the engine's pick) at the "
        "weighted buckets and slower at none",
    )


def _weighted_speedup(tests: Sequence[KernelTest]) -> float:
    overall = [t for t in tests if t.tokens == 0]
    if overall:
        return overall[0].speedup
    return math.prod(t.speedup for t in tests) ** (1 / max(len(tests), 1))


def model_communication(bench, workload, num_sms: int, dispatch, combine) -> CommunicationOf:
    """Each wire's dispatch and combine from the DeepEP model bench (``tuning.model_bench``) at the
    engine's SM count and chunks, with the model's held-out error there; None outside its
    calibrated range (another EP size, hidden size or token count)."""
    import dataclasses

    from moepolicy.tuning.bench import TunePoint

    def of(tokens: int, wire: str) -> Optional[Communication]:
        w = dataclasses.replace(workload, payload=wire)
        if bench.in_envelope(w, bench.gpu) is not None:
            return None
        error = bench.envelope(w).error_at(w.hidden, tokens, num_sms)
        if error is None:
            return None
        m = bench.measure(w, TunePoint(num_sms, tokens, dispatch, combine))
        return Communication(m.dispatch_us, m.combine_us, error)

    return of


def model_communication_words(bench, workload) -> str:
    """Where the modelled communication figures hold, in one phrase."""
    why = bench.in_envelope(workload, bench.gpu)
    if (
        why and bench.envelope(workload) is None
    ):  # the tune's own line names the calibrated targets
        return f"not modelled here: the model bench has no calibration for {bench.gpu} EP{workload.ep_size}"
    if why:
        return f"not modelled here: {why}"
    return f"modelled ({bench.identity()})"


def choice_inputs(
    facts, target, buckets, rounds: int = 16, seed: int = 0
) -> Optional[ChoiceInputs]:
    """What the comparison is for: the first MoE layer's expert shapes at the target's EP size, the
    engine's own pick and the kernels the engine can build for it here (None: no MoE layer, or no
    kernel moepolicy can time runs it)."""
    from moepolicy.expert_kernel import Deployment, default_kernel, runs_layer

    moe = facts.moe_layers
    if not moe or moe[0].moe_intermediate_size is None:
        return None
    layer = moe[0]
    where = Deployment(target.engine, target.backend, target.deepep.api)
    candidates = tuple(k for k in KERNEL_ORDERS if runs_layer(k, target.arch, layer))
    if not candidates:
        return None
    shape = ExpertShape(
        layer.hidden_size,
        layer.moe_intermediate_size,
        layer.num_experts,
        layer.top_k,
        target.ep_size,
        facts.expert_groups,
    )
    return ChoiceInputs(
        shape,
        tuple(buckets),
        default_kernel(layer, target.arch, where),
        candidates,
        rounds=rounds,
        seed=seed,
    )
