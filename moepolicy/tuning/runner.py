"""``tune`` end to end: workload from the plan, bench, studies, choice of num_sms, policy document."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from moepolicy.cli._output import note, table
from moepolicy.document import write_document
from moepolicy.errors import TuningError
from moepolicy.keys import compute_keys
from moepolicy.planner import Plan, buffer_bytes, build_document, chunk_doc, default_chunks, default_deepep_section
from moepolicy.tuning.bench import Bench, Workload
from moepolicy.tuning.space import Space
from moepolicy.tuning.study import (
    BucketResult, SmsResult, choose_sms, fingerprint, open_parent_study, pareto_front, tune_bucket,
)

DEFAULT_STORAGE = "sqlite:///moepolicy-studies.db"


def redact(url: str) -> str:
    """A storage URL with any password replaced (never logged, printed or written)."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)


def make_storage(url: str):
    import warnings

    import optuna

    # ask/tell with our own heartbeat thread is the point; optuna's experimental notes are noise here
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")

    if url.endswith(".log") or url.startswith("journal:"):
        path = url.removeprefix("journal:")
        return optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(path))
    if url.startswith(("sqlite", "postgresql", "mysql")):
        try:
            return _rdb_with_retry(url)
        except ImportError:
            raise TuningError(f"--storage {redact(url)}: the database driver is not installed "
                              "(PostgreSQL: pip install 'psycopg[binary]'; MySQL: pip install pymysql)") from None
        except Exception as exc:  # noqa: BLE001 (sqlalchemy's errors: connection refused, bad URL)
            reason = redact(str(exc).splitlines()[0]) if str(exc) else type(exc).__name__
            raise TuningError(f"--storage {redact(url)}: cannot open the study database ({reason})") from None
    raise TuningError(f"--storage {redact(url)!r}: expected an optuna RDB URL (sqlite, postgresql, "
                      "mysql) or a journal file (*.log)")


def _rdb_with_retry(url: str, attempts: int = 6):
    """Workers that start together race to create optuna's tables; the loser retries."""
    import random
    import time

    import optuna

    for attempt in range(attempts):
        try:
            return optuna.storages.RDBStorage(url, heartbeat_interval=10, grace_period=60)
        except ImportError:
            raise
        except Exception:  # noqa: BLE001
            if attempt == attempts - 1:
                raise
            time.sleep(0.2 + random.random() * 0.5 * (attempt + 1))
    raise AssertionError("unreachable")


def workload_for(plan: Plan, routing: str) -> Workload:
    moe = plan.model.moe_layers
    if not moe:
        raise TuningError(f"{plan.model.name} has no MoE layers: nothing to dispatch, nothing to tune")
    first = moe[0]
    fp8 = sum(1 for lp in plan.layers if lp.decision.wire.get("dtype") == "fp8_e4m3"
              and lp.decision.order == "quant_then_dispatch")
    payload = "fp8" if fp8 * 2 >= len(moe) else "bf16"
    return Workload(first.hidden_size, first.num_experts, first.top_k, plan.target.ep_size, payload, routing)


def _bench(kind: str, plan: Plan, args, objective) -> Bench:
    if getattr(args, "coordinated", None) is not None:
        return args.coordinated
    if kind == "model":
        from moepolicy.tuning.model_bench import ModelBench

        return ModelBench(plan.target.gpu)
    import os

    from moepolicy.tuning.live_bench import LiveBench

    worker = None
    if os.environ.get("MOEPOLICY_FAKE_DEEPEP"):
        from moepolicy.testing.fake_deepep import fake_worker as worker
    return LiveBench(plan.target.ep_size, args.max_buffer_mb * 1024 * 1024 // 128 * 128,
                     trial_timeout_s=args.trial_timeout, reps=int(objective.get("reps", 20)), worker=worker)


def _layer_with_orders(doc: dict, plan: Plan, orders: dict[int, dict]) -> None:
    """Where both orders are legal (fp8 on the wire), record both measured times in the reason and
    keep the faster order by weighted total; say so when the faster order changes with tokens."""
    if not orders:
        return
    qtd = sum(v["quant_then_dispatch"] for v in orders.values())
    dtq = sum(v["dispatch_then_quant"] for v in orders.values())
    per_bucket = "; ".join(f"T={t}: quant_then_dispatch {v['quant_then_dispatch']:.0f} us vs "
                           f"dispatch_then_quant {v['dispatch_then_quant']:.0f} us" for t, v in sorted(orders.items()))
    winners = {("quant_then_dispatch" if v["quant_then_dispatch"] <= v["dispatch_then_quant"] else "dispatch_then_quant")
               for v in orders.values()}
    changes = " The faster order changes with tokens." if len(winners) > 1 else ""
    for layer in doc["layers"]:
        if layer["order"] != "quant_then_dispatch" or (layer["wire"].get("scale") or {}).get("granularity") != "block":
            continue
        chosen = "quant_then_dispatch" if qtd <= dtq else "dispatch_then_quant"
        layer["reason"] = f"{layer['reason']} Measured (full call, both orders): {per_bucket}.{changes}"
        if chosen == "dispatch_then_quant":
            layer["order"], layer["wire"] = "dispatch_then_quant", {"dtype": "bf16"}
            layer["reason"] += " Dispatching bf16 was faster overall, so it is used."


def _section(plan: Plan, chosen: SmsResult, results: list[SmsResult], why: str, kind: str, region: str,
             study: str, storage_url: str, command: str, interrupted: bool) -> dict[str, Any]:
    target = plan.target
    buckets, configs, per_bucket = [], [], []
    for i, b in enumerate(chosen.buckets):
        if b.best is None:
            continue
        last = i == len(chosen.buckets) - 1
        configs += [b.best.dispatch, b.best.combine]
        m, d = b.best_measurement, b.default_measurement
        measured = {"dispatch_us": round(m.dispatch_us, 2), "dispatch_cached_us": round(m.dispatch_cached_us, 2),
                    "combine_us": round(m.combine_us, 2), "trials": b.trials, "failed": b.failed}
        if d is not None:
            measured["default_total_us"] = round(d.objective(region), 2)
        buckets.append({"max_tokens": None if last else b.tokens, "dispatch": chunk_doc(b.best.dispatch),
                        "combine": chunk_doc(b.best.combine), "measured": measured})
        per_bucket.append((b.tokens, d.objective(region) if d else None, m.objective(region), b.best))
    if not buckets:
        raise TuningError("no bucket has a usable measurement")
    moe = plan.model.moe_layers
    nvl, rdma = buffer_bytes(target, max(layer.hidden_size for layer in moe),
                             max(layer.num_experts for layer in moe), chosen.num_sms, configs)
    source = "measured" if kind == "live" else "modelled"
    provenance = {
        "source": source, "bench": kind, "timed_region": region, "study": study,
        "storage": redact(storage_url), "chosen_num_sms": chosen.num_sms, "why": why,
        "pareto": pareto_front(results, region), "gpu": target.gpu, "ep_size": target.ep_size,
        "deepep": target.deepep.name, "command": command,
        "date": dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat(),
    }
    if interrupted:
        provenance["note"] = "interrupted: the best found before Ctrl-C"
    return {"num_sms": chosen.num_sms, "num_nvl_bytes": nvl, "num_rdma_bytes": rdma, "buckets": buckets,
            "provenance": provenance}, per_bucket


def default_chunks_effective(target) -> tuple:
    from moepolicy.runtime.buffers import effective_rdma_recv

    d, c = default_chunks(target)
    return ((d[0], d[1], d[2], effective_rdma_recv(d[2], d[3])), (c[0], c[1], c[2], effective_rdma_recv(c[2], c[3])))


def sms_grid(space: Space, target, args) -> list[int]:
    """The SM counts to try: ``--sms`` when given (checked), else the space's grid under ``--max-sms``."""
    if not getattr(args, "sms", None):
        return space.sms_candidates(target.profile.sm_count, args.max_sms)
    try:
        sms_list = sorted({int(s) for s in args.sms.split(",")})
    except ValueError:
        raise TuningError(f"--sms takes even integers like 20,24, got {args.sms!r}") from None
    bad = [s for s in sms_list if s <= 0 or s % 2 or s > target.profile.sm_count]
    if bad:
        raise TuningError(f"--sms {bad[0]}: SM counts must be even, positive and at most "
                          f"{target.profile.sm_count} on {target.gpu}")
    return sms_list


def overlap_gemm_kind(asked: str, plan: Plan) -> tuple[str, str]:
    """The stand-in expert GEMM for ``--overlap-gemm auto``: clustered where the experts run DeepGEMM
    (its multicast launches put 2-CTA clusters on the GPU at these sizes, and DeepEP's cooperative
    cluster launch fits beside those, not beside an unclustered persistent kernel: run 26), else
    the unclustered persistent kernel."""
    if asked != "auto":
        return asked, f"--overlap-gemm {asked}"
    if "deepgemm" in plan.kernel_label:
        return "persistent-clustered", ("--overlap-gemm auto: the experts run DeepGEMM, which launches 2-CTA "
                                        "clusters (TMA multicast) at these sizes")
    return "persistent", f"--overlap-gemm auto: the experts run {plan.kernel_label}, launched without clusters"


def _tune_overlap(plan: Plan, bench, workload: Workload, space: Space, buckets, args, command, default) -> dict:
    from moepolicy.cli._deepep_summary import overlap_lines
    from moepolicy.tuning.overlap import search_overlap

    if not hasattr(bench, "measure_overlap"):
        raise TuningError("--overlap needs the live bench: it times DeepEP beside a confined GEMM on GPUs")
    grid = sms_grid(space, plan.target, args)
    rounds = getattr(args, "confirm_rounds", 5)
    if rounds < 1 or args.trials < 0:
        raise TuningError(f"--overlap needs --confirm-rounds >= 1 and --trials >= 0 (got {rounds} and {args.trials})")
    gemm_kind, why_kind = overlap_gemm_kind(getattr(args, "overlap_gemm", "auto"), plan)
    note(f"overlap: expert GEMM stand-in {gemm_kind} ({why_kind})")
    try:
        found = search_overlap(plan, bench, workload, buckets, grid, default, trials=args.trials,
                               rounds=rounds, seed=args.seed, gemm_kind=gemm_kind,
                               confine=getattr(args, "overlap_confine", "grid"),
                               order=getattr(args, "overlap_order", "gemm-first"))
    finally:
        bench.close()
    c = found["comm_sms"]
    buckets_doc, configs = [], []
    for i, (tokens, _) in enumerate(buckets):
        d, cc = found["chunks"][tokens]
        configs += [d, cc]
        buckets_doc.append({"max_tokens": None if i == len(buckets) - 1 else tokens, "dispatch": chunk_doc(d),
                            "combine": chunk_doc(cc), "measured": found["per_bucket"][tokens]})
    moe = plan.model.moe_layers
    nvl, rdma = buffer_bytes(plan.target, max(x.hidden_size for x in moe), max(x.num_experts for x in moe), c, configs)
    section = {"num_sms": c, "num_nvl_bytes": nvl, "num_rdma_bytes": rdma, "buckets": buckets_doc,
               "provenance": {"source": "measured", "bench": "live-overlap", "command": command,
                              "date": dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()},
               "overlap": {k: found[k] for k in ("comm_sms", "gemm_sms", "gemm", "gemm_fallback", "order", "splits_us",
                                                 "configs_measured", "confirmed_us", "why") if found.get(k) is not None}}
    doc = build_document(plan, deepep=section, command=command)
    write_document(doc, args.output)
    note(f"overlap: {c} communication SMs, GEMM on {found['gemm_sms']}: {found['why']}")
    for tokens, row in found["per_bucket"].items():
        note(f"  T={tokens}:")
        for line in overlap_lines(row):
            note(line)
    return doc


def _extrapolated(plan: Plan, why: str, command: str) -> dict[str, Any]:
    section = default_deepep_section(plan)
    section["provenance"] = {"source": "extrapolated", "note": f"outside the model bench's measured "
                             f"envelope ({why}): DeepEP's default configs", "command": command}
    return section


def tune_plan(plan: Plan, *, kind: str, args, space: Space, objective: dict, buckets: list[tuple[int, float]],
              command: str) -> dict[str, Any]:
    target = plan.target
    region = objective["timed_region"]
    workload = workload_for(plan, objective.get("routing", "uniform"))
    bench = _bench(kind, plan, args, objective)
    outside = bench.in_envelope(workload, target.gpu)
    if outside:
        note(f"model bench: {outside}; the policy keeps DeepEP's defaults, labelled extrapolated")
        doc = build_document(plan, deepep=_extrapolated(plan, outside, command), command=command)
        write_document(doc, args.output)
        return doc
    storage_url = args.storage or DEFAULT_STORAGE
    storage = make_storage(storage_url)
    name = args.study or f"{plan.model.name.split('/')[-1]}-{target.gpu}-ep{target.ep_size}-{target.backend}-{kind}"
    fp = fingerprint({"facts": plan.model.sha256(), "gpu": target.gpu, "ep": target.ep_size,
                      "layout": target.layout, "deepep": target.deepep.name, "space": space.sha256,
                      "objective": objective, "bench": kind, "payload": workload.payload,
                      "buckets": buckets, "max_buffer_mb": args.max_buffer_mb})
    open_parent_study(storage, name, note, fp)
    default_d, default_c = default_chunks(target)
    from moepolicy.runtime.buffers import effective_rdma_recv

    default = ((default_d[0], default_d[1], default_d[2], effective_rdma_recv(default_d[2], default_d[3])),
               (default_c[0], default_c[1], default_c[2], effective_rdma_recv(default_c[2], default_c[3])))
    if getattr(args, "overlap", False):
        return _tune_overlap(plan, bench, workload, space, buckets, args, command, default_chunks_effective(target))
    sms_list = sms_grid(space, target, args)
    note(f"tuning {workload.hidden=} {workload.num_experts=} {workload.top_k=} payload={workload.payload} "
         f"on {len(sms_list)} SM counts x {len(buckets)} buckets x {args.trials} trials ({region} region)")
    results: list[SmsResult] = []
    interrupted = False
    try:
        bench.start(workload)
        for num_sms in sms_list:
            max_recv = space.max_nvl_recv(num_sms, workload.hidden, target.ep_size, args.max_buffer_mb * 1024 * 1024)
            if max_recv == 0:
                note(f"  sms {num_sms}: no receive capacity fits --max-buffer-mb {args.max_buffer_mb}; skipped")
                continue
            result = SmsResult(num_sms, [BucketResult(t, w) for t, w in buckets])
            results.append(result)
            for bucket in result.buckets:
                tune_bucket(storage, f"{name}/sms{num_sms}/t{bucket.tokens}", bench, workload, space, num_sms,
                            bucket, args.trials, default, target.layout == "internode", max_recv, region,
                            args.seed, True, note)
    except KeyboardInterrupt:
        interrupted = True
        note("interrupted: writing the best found so far")
    chosen, why = choose_sms(results, region, args.max_sms, float(objective.get("pareto_tolerance", 0.05)))
    orders: dict[int, dict] = {}
    if kind == "live" and workload.payload == "fp8" and not interrupted:
        import dataclasses

        both = dataclasses.replace(workload, both_orders=True)
        for b in chosen.buckets:
            if b.best is not None:
                try:
                    orders[b.tokens] = bench.measure(both, b.best).orders
                except Exception as exc:  # noqa: BLE001
                    note(f"  both-order measurement at T={b.tokens} failed: {exc}")
    bench.close()
    section, per_bucket = _section(plan, chosen, results, why, kind, region, name, storage_url, command, interrupted)
    doc = build_document(plan, deepep=section, command=command)
    _layer_with_orders(doc, plan, orders)
    doc["key"] = compute_keys(doc)
    write_document(doc, args.output)
    _report(chosen, per_bucket, why, kind, region)
    if interrupted:
        raise KeyboardInterrupt
    return doc


def _report(chosen: SmsResult, per_bucket, why: str, kind: str, region: str) -> None:
    label = "measured" if kind == "live" else "modelled"
    rows = []
    for tokens, default, tuned, point in per_bucket:
        gain = f"{(default / tuned - 1) * 100:+.1f}%" if default else "-"
        rows.append([tokens, f"{default:.1f}" if default else "-", f"{tuned:.1f}", gain,
                     f"d{point.dispatch[:2]} c{point.combine[:2]}"])
    import sys

    print(f"num_sms {chosen.num_sms}: {why}", file=sys.stderr)
    table(["tokens", f"default us ({label}, {region})", "tuned us", "gain", "config (nvl send, recv)"], rows,
          out=sys.stderr)
