"""Which expert kernel, with which order, makes a rank's MoE step fastest: the step is the rank's
own compute (its sender quantization and expert stage, from an :class:`~moepolicy.tuning.
expert_bench.ExpertBench`) plus the communication of the arm's wire (dispatch and combine, from a
:class:`Communication` source), per token bucket.

The protocol (``tuning.protocol``, the ``experts`` family's level split among the stages it runs):
each kernel's two orders are one comparing stage, bucket by bucket with Holm's correction over the
buckets; another kernel against the engine's pick (as the engine runs it) is one joint stage whose
candidates are the kernel with each order per bucket (the selection rounds pick one). Verdicts come
from gate rounds; every figure printed or written comes from report rounds, which decided nothing.
Communication from a model enters adversarially: the contender's dispatch is raised by the model's
error and the baseline's lowered (the combine is bf16 in every order: the same op either way), so a
verdict never rests on the model being right. Where no communication figure exists (outside the
model's range), an order is still claimed one way only: quantizing first puts half the bytes on the
wire (fp8 with 1x128 scales against bf16), so where its compute is faster beyond noise, its step is
too; the other way needs the communication and is not claimed.

The kernel gate: another kernel replaces the engine's pick only where its step is faster beyond
noise on the weighted buckets and slower at none; where the engine's pick could not be measured
here nothing is claimed against it (``faster_kernel`` stays ``unmeasured``).

A modelled bench (noise-free) answers with one figure and an error instead of rounds: a verdict
needs the difference to exceed the errors of both sides.

Nothing here imports the planner or the document: it returns a ``schema.measured.ExpertChoice``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence

from moepolicy.measure.rounds import least_rounds
from moepolicy.measure.routing import ExpertShape
from moepolicy.names import UNMEASURED
from moepolicy.schema.measured import ArmTiming, ExpertChoice, KernelTest, OrderTiming
from moepolicy.tuning.expert_bench import KERNEL_ORDERS, ExpertBench, arm_name
from moepolicy.tuning.protocol import FAMILY_LEVELS, Option, Stage, run
from moepolicy.tuning.bench import TunePoint

QTD, DTQ = "quant_then_dispatch", "dispatch_then_quant"
WIRE_OF_ORDER = {QTD: "fp8", DTQ: "bf16", "no_quant": "bf16"}


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
    rounds: int = 12  # per phase (gate, report; selection where a kernel stage runs)
    communication_words: str = ""  # where the communication figures come from
    seed: int = 0


@dataclass(frozen=True)
class _Bucket:
    tokens: int
    weight: float
    compute: dict[str, list[float]]  # arm -> its compute (one value, modelled; empty, measured)
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


class _Modelled:
    """A noise-free (modelled) bench: one figure and an error per arm instead of rounds; a verdict
    needs the difference to exceed the errors of both sides."""

    def __init__(self, inputs: ChoiceInputs, bench: ExpertBench, buckets: list[_Bucket]):
        self.inputs, self.bench, self.buckets = inputs, bench, buckets

    def _bounds(self, b: _Bucket, arm: str, sign: int, with_comm: bool) -> float:
        x = b.compute[arm][0] * (1 + sign * b.error)
        if with_comm:
            c = b.comm[WIRE_OF_ORDER[arm.split("/", 1)[1]]]
            assert c is not None, "with_comm: both arms' wires have a figure (_has_comm)"
            x += c.dispatch_us * (1 + sign * c.error) + c.combine_us
        return x

    def verdict(self, b: _Bucket, contender: str, baseline: str, one_way: bool) -> str:
        with_comm = _has_comm(b, contender, baseline) and not _same_wire(contender, baseline)
        if self._bounds(b, contender, +1, with_comm) < self._bounds(b, baseline, -1, with_comm):
            return "faster"
        if not one_way and self._bounds(b, contender, -1, with_comm) > (
            self._bounds(b, baseline, +1, with_comm)
        ):
            return "slower"
        return "within noise"

    def figure(self, b: _Bucket, arm: str) -> float:
        compute = b.compute[arm][0]
        return compute if not _has_comm(b, arm) else _step(b, arm, [compute])[0]

    def orders(self, kernel: str, basis: str, one_way: bool) -> tuple[OrderTiming, ...]:
        qtd, dtq = arm_name(kernel, QTD), arm_name(kernel, DTQ)
        out = []
        for b in self.buckets:
            q, d = self.figure(b, qtd), self.figure(b, dtq)
            if one_way:
                q, d = b.compute[qtd][0], b.compute[dtq][0]
            verdict = self.verdict(b, qtd, dtq, one_way)
            out.append(
                OrderTiming(
                    tokens=b.tokens,
                    quant_then_dispatch_us=round(q, 2),
                    dispatch_then_quant_us=round(d, 2),
                    rounds=0,
                    speedup=round(d / q, 4),
                    verdict={"faster": QTD, "slower": DTQ}.get(verdict, UNMEASURED),
                    basis=basis,
                )
            )
        return tuple(out)

    def best_arm(self, kernel: str, b: _Bucket) -> str:
        """The kernel's faster order at ``b`` by the model's figure."""
        arms = [arm_name(kernel, o) for o in KERNEL_ORDERS[kernel]]
        return min(arms, key=lambda arm: _step(b, arm, b.compute[arm])[0])

    def kernel(self, contender: str, baseline: str) -> tuple[bool, tuple[KernelTest, ...]]:
        c_arms = [self.best_arm(contender, b) for b in self.buckets]
        b_arms = [_engine_arm(baseline)] * len(self.buckets)
        if not all(
            _has_comm(b, c, d) or _same_wire(c, d) for b, c, d in zip(self.buckets, c_arms, b_arms)
        ):
            return False, ()
        verdicts = [self.verdict(b, c, d, False) for b, c, d in zip(self.buckets, c_arms, b_arms)]
        tests = tuple(
            KernelTest(b.tokens, c, d, v, round(self.figure(b, d) / self.figure(b, c), 4))
            for b, c, d, v in zip(self.buckets, c_arms, b_arms, verdicts)
        )
        return all(v != "slower" for v in verdicts) and any(v == "faster" for v in verdicts), tests


def _engine_arm(kernel: str) -> str:
    """The arm the engine runs for ``kernel``: its first order (DeepGEMM's experts take fp8 rows
    quantized before the dispatch, as vLLM sends them; FlashInfer's quantize their own bf16)."""
    return arm_name(kernel, KERNEL_ORDERS[kernel][0])


class ExpertTimer:
    """The protocol's timer on an :class:`ExpertBench`: each group of rounds is one call of the
    bench (its arms over balanced rounds after a warm-up); its processes stay (nothing to restart)."""

    def __init__(self, bench: ExpertBench, shape: ExpertShape):
        self.bench, self.shape = bench, shape

    def fresh(self, phase: str) -> None:
        pass

    def rounds(self, arms: Mapping[int, Sequence[str]], rounds: int) -> dict:
        return {
            t: self.bench.times(self.shape, t, list(a), rounds).per_round for t, a in arms.items()
        }


def _bound(buckets: dict[int, _Bucket]):
    """How a test sees an arm: its compute plus its wire's communication (the modelled dispatch
    raised by its error for the side whose claim is tested, lowered for the other) where the two
    arms send different wires and both have a figure; the compute alone otherwise (the same wire's
    communication cancels; without a figure there is none to add)."""

    def bound(tokens: int, arm: str, other: str, sign: int, xs: list[float]) -> list[float]:
        b = buckets[tokens]
        if not _has_comm(b, arm, other) or _same_wire(arm, other):
            return xs
        return _step(b, arm, xs, sign)

    return bound


def _order_stage(kernel: str, weights, bound, one_way: bool) -> Stage:
    """Both orders of ``kernel``, bucket by bucket: quantizing first against quantizing after, a
    claim either way (only quantizing first where some bucket has no communication figure)."""
    return Stage(
        f"{kernel}'s order",
        Option(DTQ, {t: arm_name(kernel, DTQ) for t in weights}, "quantizing after the dispatch"),
        (Option(QTD, {t: arm_name(kernel, QTD) for t in weights}),),
        joint=False,
        sides="faster" if one_way else "both",
        compare=True,
        bound=bound,
    )


def _kernel_stage(kernels: Sequence[str], default: str, weights, bound) -> Stage:
    """Another kernel instead of the engine's pick (run as the engine runs it), on the weighted
    buckets and slower at none; each kernel's order per bucket is its candidates' choice (the
    selection rounds pick one)."""
    import itertools

    candidates = []
    for kernel in kernels:
        if kernel == default:
            continue
        for orders in itertools.product(KERNEL_ORDERS[kernel], repeat=len(weights)):
            arms = {t: arm_name(kernel, o) for t, o in zip(weights, orders)}
            candidates.append(Option(kernel, arms))
    base = Option(
        default, {t: _engine_arm(default) for t in weights}, f"{default} (the engine's pick)"
    )
    return Stage("the expert kernel", base, tuple(candidates), compare=True, bound=bound)


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
    comm = {
        t: {wire: communication(t, wire) for wire in ("fp8", "bf16")} for t, _ in inputs.buckets
    }
    if bench.noise_free:
        return _modelled_choice(inputs, bench, measured, statuses, comm)
    return _measured_choice(inputs, bench, measured, statuses, comm)


def _plan(inputs: ChoiceInputs, measured: list[str]) -> tuple[list[str], bool, int]:
    """The kernels whose orders are compared, whether the kernel stage runs, and the level each
    stage gets (the experts family's, split among them ahead of any measurement)."""
    two = [k for k in measured if len(KERNEL_ORDERS[k]) == 2]
    gate_kernels = inputs.engine_default in measured and len(measured) > 1
    return two, gate_kernels, len(two) + int(gate_kernels)


def least_rounds_for(inputs: ChoiceInputs, measured: list[str]) -> int:
    """The fewest rounds per phase in which every stage can claim at its level (Holm over the
    buckets, the orders split per side)."""
    two, _, stages = _plan(inputs, measured)
    level = FAMILY_LEVELS["experts"] / max(stages, 1)
    per_side = level / 2 if two else level
    return least_rounds(len(inputs.buckets), per_side)


def _measured_choice(inputs, bench, measured, statuses, comm) -> ExpertChoice:
    needed = least_rounds_for(inputs, measured)
    if inputs.rounds < needed:
        raise ValueError(
            f"rounds: the expert-stage comparison needs at least {needed} rounds per phase for its "
            f"claims at their level (the experts family's {FAMILY_LEVELS['experts']:.2%}, Holm over "
            f"{len(inputs.buckets)} buckets), got {inputs.rounds}"
        )
    weights = dict(inputs.buckets)
    buckets = {t: _Bucket(t, w, {}, 0.0, comm[t]) for t, w in inputs.buckets}
    bound, timer = _bound(buckets), ExpertTimer(bench, inputs.shape)
    two, gate_kernels, stages = _plan(inputs, measured)
    level = FAMILY_LEVELS["experts"] / max(stages, 1)
    comm_everywhere = all(v is not None for c in comm.values() for v in c.values())
    basis = _basis(bench, inputs, comm_everywhere)
    medians: dict[int, dict[str, float]] = {t: {} for t in weights}
    orders = []
    for kernel in two:
        stage = _order_stage(kernel, weights, bound, one_way=not comm_everywhere)
        done = run([stage], timer, weights, inputs.rounds, level)
        orders.append((kernel, _order_timings(kernel, done, buckets, basis, comm_everywhere)))
        _collect(medians, done)
    faster_kernel, tests, why = UNMEASURED, (), _unmeasured_default(inputs, statuses)
    if gate_kernels:
        faster_kernel, tests, why = _kernel_gate(
            inputs, measured, (weights, bound, timer, level), buckets, medians
        )
    return ExpertChoice(
        engine_default=inputs.engine_default,
        faster_kernel=faster_kernel,
        source=bench.source,
        basis=basis if two else bench.describe(),
        why=why,
        kernels=statuses,
        arms=_arm_timings(measured, buckets, medians),
        orders=tuple(orders),
        tests=tests,
        rounds=inputs.rounds,
    )


def _unmeasured_default(inputs: ChoiceInputs, statuses) -> str:
    default = inputs.engine_default
    detail = next((s.detail for s in statuses if s.kernel == default), "not a candidate here")
    return (
        f"{default} (the engine's pick) was not measured here ({detail}): nothing is claimed "
        "against it, and it is kept unless another kernel is asked for"
    )


def _collect(medians: dict, done) -> None:
    for t, by_arm in done.times_us.items():
        medians[t].update(by_arm)


def _order_timings(kernel, done, buckets, basis, comm_everywhere) -> tuple[OrderTiming, ...]:
    """Each bucket's orders: the gate's verdict, the report's medians and figure."""
    gated, out = done.stages[0], []
    qtd, dtq = arm_name(kernel, QTD), arm_name(kernel, DTQ)
    for t, b in buckets.items():
        test, shown = gated.tests[t], done.figures[t][DTQ]
        q, d = done.times_us[t][qtd], done.times_us[t][dtq]
        if comm_everywhere:
            q, d = _step(b, qtd, [q])[0], _step(b, dtq, [d])[0]
        out.append(
            OrderTiming(
                tokens=t,
                quant_then_dispatch_us=round(q, 2),
                dispatch_then_quant_us=round(d, 2),
                rounds=shown.rounds,
                speedup=round(shown.speedup, 4),
                ci95=None if shown.low is None else (round(shown.low, 4), round(shown.high, 4)),
                verdict={"faster": QTD, "slower": DTQ}.get(test.verdict, UNMEASURED),
                correction=test.correction,
                basis=basis,
            )
        )
    return tuple(out)


def _kernel_gate(inputs, measured, how, buckets, medians):
    """The kernel stage: another kernel replaces the engine's pick only where its step is faster
    beyond noise on the weighted buckets and slower at none."""
    weights, bound, timer, level = how
    default = inputs.engine_default
    stage = _kernel_stage(measured, default, weights, bound)
    comparable = all(
        _has_comm(b, c.arms[t], stage.baseline.arms[t])
        or _same_wire(c.arms[t], stage.baseline.arms[t])
        for c in stage.candidates
        for t, b in buckets.items()
    )
    if not comparable:
        return (
            UNMEASURED,
            (),
            f"the kernels send different wires and this target has no communication figure: "
            f"{default} (the engine's pick) is kept",
        )
    done = run([stage], timer, weights, inputs.rounds, level)
    _collect(medians, done)
    gated = done.stages[0]
    first = next(iter(weights))
    pick = gated.pick[first]
    if pick is stage.baseline:
        return (
            UNMEASURED,
            (),
            f"no kernel's MoE step was faster than {default} (the engine's pick) in the selection "
            "rounds: it is kept",
        )
    tests = [
        KernelTest(
            t,
            pick.arms[t],
            stage.baseline.arms[t],
            gated.tests[t].verdict if t in gated.tests else "within noise",
            round(done.figures[t][default].speedup, 4),
            _ci(done.figures[t][default]),
            correction=gated.tests[t].correction if t in gated.tests else "",
        )
        for t in weights
    ]
    overall = done.weighted.get(default)
    tests.append(
        KernelTest(
            0,
            pick.name,
            default,
            gated.overall.verdict,
            round(overall.speedup, 4),
            _ci(overall),
        )
    )
    if gated.claimed(first):
        return (
            pick.name,
            tuple(tests),
            f"{pick.name}'s MoE step was faster beyond noise than {default} (the engine's pick) at "
            "the weighted buckets and slower at none (gate rounds; the figures from report rounds)",
        )
    return (
        UNMEASURED,
        tuple(tests),
        f"no kernel's MoE step was faster beyond noise than {default} (the engine's pick) at "
        "the weighted buckets without being slower at one: it is kept",
    )


def _ci(f) -> Optional[tuple[float, float]]:
    return None if f is None or f.low is None else (round(f.low, 4), round(f.high, 4))


def _basis(bench: ExpertBench, inputs: ChoiceInputs, comm_everywhere: bool) -> str:
    compute = bench.describe()
    if comm_everywhere:
        return f"{compute}; communication {inputs.communication_words}"
    return (
        f"{compute}; no communication figure for this target "
        f"({inputs.communication_words}): the times are compute only, and only quantizing "
        "first can be claimed (it puts half the bytes on the wire)"
    )


def _arm_timings(measured, buckets, medians) -> tuple[tuple[int, tuple[ArmTiming, ...]], ...]:
    """Each arm's compute (the report's median) and its wire's communication, per bucket."""
    out = []
    for t, b in buckets.items():
        timings = []
        for kernel in measured:
            for order in KERNEL_ORDERS[kernel]:
                arm = arm_name(kernel, order)
                if arm not in medians[t]:
                    continue
                c = b.comm.get(WIRE_OF_ORDER[order])
                timings.append(
                    ArmTiming(
                        kernel,
                        order,
                        round(medians[t][arm], 2),
                        None if c is None else round(c.dispatch_us, 2),
                        None if c is None else round(c.combine_us, 2),
                    )
                )
        out.append((t, tuple(timings)))
    return tuple(out)


def _modelled_choice(inputs, bench, measured, statuses, comm) -> ExpertChoice:
    """A recorded (noise-free) bench: one figure per arm with its error; reported, never decided on
    by a test."""
    arms = [arm_name(k, o) for k in measured for o in KERNEL_ORDERS[k]]
    buckets = []
    for tokens, weight in inputs.buckets:
        times = bench.times(inputs.shape, tokens, arms, 1)
        buckets.append(_Bucket(tokens, weight, times.per_round, times.error, comm[tokens]))
    model = _Modelled(inputs, bench, buckets)
    comm_everywhere = all(_has_comm(b, *arms) for b in buckets)
    basis = _basis(bench, inputs, comm_everywhere)
    orders = [
        (k, model.orders(k, basis, not comm_everywhere))
        for k in measured
        if len(KERNEL_ORDERS[k]) == 2
    ]
    faster_kernel, tests, why = UNMEASURED, (), _unmeasured_default(inputs, statuses)
    if inputs.engine_default in measured:
        faster_kernel, tests, why = _modelled_gate(model, inputs, measured)
    errors = [100 * b.error for b in buckets]
    basis = (basis if orders else bench.describe()) + (
        f"; the expert-stage model's error at these buckets: {min(errors):.0f}-{max(errors):.0f} %"
    )
    medians = {b.tokens: {a: b.compute[a][0] for a in arms} for b in buckets}
    return ExpertChoice(
        engine_default=inputs.engine_default,
        faster_kernel=faster_kernel,
        source=bench.source,
        basis=basis,
        why=why,
        kernels=statuses,
        arms=_arm_timings(measured, {b.tokens: b for b in buckets}, medians),
        orders=tuple(orders),
        tests=tests,
        rounds=0,
    )


def _modelled_gate(model: _Modelled, inputs: ChoiceInputs, measured: list[str]):
    default = inputs.engine_default
    for kernel in measured:
        if kernel == default:
            continue
        wins, tests = model.kernel(kernel, default)
        if wins:
            return (
                kernel,
                tests,
                f"{kernel}'s MoE step was faster beyond the model's error than {default} (the "
                "engine's pick) at a bucket and slower at none (modelled)",
            )
    return (
        UNMEASURED,
        (),
        f"no kernel's MoE step was faster beyond the model's error than {default} (the engine's "
        "pick) without being slower at a bucket: it is kept",
    )


def model_communication(bench, workload, num_sms: int, dispatch, combine) -> CommunicationOf:
    """Each wire's dispatch and combine from the DeepEP model bench (``tuning.model_bench``) at the
    engine's SM count and chunks, with the model's held-out error there; None outside its
    calibrated range (another EP size, hidden size or token count)."""
    import dataclasses

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
    if why and bench.envelope(workload) is None:
        # the tune's own line names the calibrated targets
        return f"not modelled here: the model bench has no calibration for {bench.gpu} EP{workload.ep_size}"
    if why:
        return f"not modelled here: {why}"
    return f"modelled ({bench.identity()})"


def choice_inputs(
    facts, target, buckets, rounds: int = 12, seed: int = 0
) -> Optional[ChoiceInputs]:
    """What the comparison is for: the first MoE layer's expert shapes at the target's EP size, the
    engine's own pick and the kernels the engine can build for it here (None: no MoE layer, or no
    kernel moepolicy can time runs it)."""
    # the kernel sheets (YAML, Pydantic): read only where a kernel is chosen
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
