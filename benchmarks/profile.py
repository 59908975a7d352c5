"""``python -m benchmarks.profile``: where the seconds of a 1M-event run go, for Krishiv's source and pipelines.

One process, like ``make bench``: its own broker, a topic of seeded orders, one warm SparkSession (start-up and a
warm-up run reported apart). It times the raw consume (the limit), Spark's scan of the Python source alone, the
at-least-once baseline, Krishiv's windowed pipeline and the ``events`` kind; each Krishiv run is recorded by
`py-spy <https://github.com/benfred/py-spy>`_ (``--subprocesses``: the driver's Python, Spark's Python workers and
the streaming source's runner; the JVM is not Python, so its share is its CPU time) and split per phase:

* wall seconds per phase of Spark's query progress (``latestOffset``, ``queryPlanning``, ``addBatch``: the
  ``foreachBatch`` sink, Kafka's read included, ``walCommit``, ``commitOffsets``), then the relay;
* CPU seconds per process (JVM, driver Python, Python workers, source runner), sampled from the process tree;
* py-spy's samples as seconds per process and the top frames by self and by inclusive time.

It writes one text summary (``--out``, e.g. ``benchmarks/results/profile-before.txt``), not flame graphs: the
collapsed stacks stay in the work folder for a flame graph tool. py-spy is in the ``bench`` extra; it needs
ptrace rights over the process (root, or ``kernel.yama.ptrace_scope=0``).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import psutil

from krishiv_core.errors import KrishivError
from krishiv_core.spec import KrishivSpec, load_spec

SAMPLE_RATE_HZ = 100
PHASES = ("latestOffset", "queryPlanning", "getBatch", "addBatch", "walCommit", "commitOffsets")


@dataclass
class CpuSeconds:
    """CPU seconds per kind of process of this process's tree, from the highest reading seen of each process."""

    by_pid: dict[int, tuple[str, float]] = field(default_factory=dict)

    def totals(self) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for kind, seconds in self.by_pid.values():
            out[kind] += seconds
        return dict(out)


def process_kind(proc: psutil.Process, me: int) -> str:
    """What a process of the tree is: ``driver python``, ``jvm``, ``python worker``, ``source runner``, ``other``."""
    if proc.pid == me:
        return "driver python"
    try:
        cmd = " ".join(proc.cmdline())
        name = proc.name()
    except psutil.Error:
        return "other"
    if name == "java":
        return "jvm"
    if "tansu" in cmd or "tansu" in name:
        return "broker (Tansu)"
    if "py-spy" in cmd or "py-spy" in name:
        return "py-spy (the profiler)"
    if "python_streaming_source_runner" in cmd:
        return "source runner"
    if name.startswith("python") or "pyspark" in cmd:
        return "python worker"
    return "other"


class CpuSampler:
    """``with CpuSampler() as s:`` CPU seconds each process of the tree used while inside (processes that start
    and end between two samples are missed; Spark reuses its Python workers, so few do)."""

    def __init__(self, interval_s: float = 1.0) -> None:
        self.interval_s = interval_s
        self.start: dict[int, float] = {}
        self.result = CpuSeconds()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)

    def _read(self) -> dict[int, tuple[str, float]]:
        me = psutil.Process(os.getpid())
        seen = {}
        for proc in [me, *me.children(recursive=True)]:
            try:
                times = proc.cpu_times()
            except psutil.Error:
                continue
            seen[proc.pid] = (process_kind(proc, me.pid), times.user + times.system)
        return seen

    def sample(self) -> None:
        for pid, (kind, seconds) in self._read().items():
            used = seconds - self.start.get(pid, 0.0)
            if used > self.result.by_pid.get(pid, (kind, 0.0))[1]:
                self.result.by_pid[pid] = (kind, used)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> CpuSampler:
        self.start = {pid: seconds for pid, (_kind, seconds) in self._read().items()}
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


@contextmanager
def py_spy(output: Path, rate: int = SAMPLE_RATE_HZ) -> Iterator[None]:
    """Record this process and its children with py-spy (collapsed stacks in ``output``) while inside."""
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(exe).exists():
        raise KrishivError("py-spy is not installed: pip install 'krishiv[bench]' (or py-spy) and try again")
    command = [exe, "record", "--pid", str(os.getpid()), "--subprocesses", "--nonblocking"]
    command += ["--rate", str(rate), "--format", "raw", "--output", str(output)]
    recorder = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and recorder.poll() is None and not _attached(recorder.pid):
        time.sleep(0.05)
    if recorder.poll() is not None:
        raise KrishivError(f"py-spy did not start: {recorder.stderr.read().decode(errors='replace').strip()}")
    try:
        yield
    finally:
        recorder.send_signal(signal.SIGINT)
        try:
            recorder.wait(60)
        except subprocess.TimeoutExpired:
            recorder.kill()


def _attached(pid: int) -> bool:
    """Whether py-spy has begun sampling (it runs a thread per sampled process once attached)."""
    try:
        return psutil.Process(pid).num_threads() > 1
    except psutil.Error:
        return False


def _frame(text: str) -> str:
    """``function (file.py:12)`` -> ``function (file.py)``: inclusive time per function, not per line."""
    name, _, where = text.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    parts = Path(path).parts
    short = "/".join(parts[-2:]) if parts else path
    return f"{name} ({short})" if where else name


def _process_label(roots: Sequence[str]) -> str:
    """A kind of process from py-spy's ``process 123:"command"`` frames (outermost first): the innermost names it."""
    if len(roots) <= 1:
        return "driver python"
    command = roots[-1].partition(":")[2].strip('"')
    if "python_streaming_source_runner" in command:
        return "source runner"
    if "pyspark.daemon" in command or "worker_daemon" in command:
        module = command.split()[-1]
        if len(roots) == 3 or module.endswith("daemon"):
            return f"daemon ({module})"
        return "python worker" if module == "pyspark.worker" else f"python worker ({module.rsplit('.', 1)[-1]})"
    return "other python"


_ROOT = re.compile(r'(process \d+:"[^"]*");?')
#: Leaf frames of a thread waiting, which ``--nonblocking`` sampling cannot always tell from running.
IDLE_LEAVES = ("manager (daemon.py)", "Condition.wait (threading.py)")


def summarize_stacks(path: Path, rate: int = SAMPLE_RATE_HZ, top: int = 20) -> list[str]:
    """py-spy's collapsed stacks as lines: seconds per process kind, then top frames by self and inclusive time."""
    per_kind: Counter[str] = Counter()
    idle: Counter[str] = Counter()
    self_time: dict[str, Counter[str]] = defaultdict(Counter)
    inclusive: dict[str, Counter[str]] = defaultdict(Counter)
    if not path.exists():
        return [f"(no py-spy output at {path})"]
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        roots = _ROOT.findall(stack)  # a command line may hold ';' itself
        kind = _process_label(roots)
        frames = [f for f in _ROOT.sub("", stack).split(";") if f and not f.startswith("thread ")]
        if not frames:
            continue
        leaf = _frame(frames[-1])
        if leaf in IDLE_LEAVES:
            idle[kind] += count
            continue
        per_kind[kind] += count
        self_time[kind][leaf] += count
        for name in {_frame(f) for f in frames}:
            inclusive[kind][name] += count
    lines = ["py-spy samples of running threads (seconds = samples / rate; waiting in the daemon loop left out):"]
    for kind in sorted(set(per_kind) | set(idle), key=lambda k: (-per_kind[k], -idle[k])):
        lines.append(f"  {kind:<44} {per_kind[kind] / rate:8.2f} s   (+{idle[kind] / rate:.2f} s waiting)")
    for kind, n in per_kind.most_common():
        if n / rate < 0.5:
            continue
        lines.append(f"  -- {kind}: top {top} by self time")
        lines += [f"     {c / rate:7.2f} s  {name}" for name, c in self_time[kind].most_common(top)]
        lines.append(f"  -- {kind}: top {top} by inclusive time")
        lines += [f"     {c / rate:7.2f} s  {name}" for name, c in inclusive[kind].most_common(top)]
    return lines


def phase_seconds(progress: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Wall seconds per phase of Spark's query progress, summed over the query's batches."""
    out: dict[str, float] = defaultdict(float)
    for p in progress:
        for phase, ms in (p.get("durationMs") or {}).items():
            out[phase] += ms / 1000
    return dict(out)


@dataclass
class ProfiledRun:
    name: str
    events: int
    seconds: float
    commit_s: float
    batches: int
    phases: dict[str, float]
    batch_seconds: list[float]
    cpu: dict[str, float]
    stacks: list[str]
    extra: str = ""


class ProgressLog:
    """Every progress report of the session's queries, by query name (a finished query's ``recentProgress`` goes
    with its object, which the runs do not return)."""

    def __init__(self, spark: Any) -> None:
        from pyspark.sql.streaming import StreamingQueryListener

        self.by_query: dict[str, list[dict[str, Any]]] = defaultdict(list)
        log = self

        class Listener(StreamingQueryListener):
            def onQueryStarted(self, event: Any) -> None:
                pass

            def onQueryProgress(self, event: Any) -> None:
                progress = event.progress
                log.by_query[progress.name or ""].append({"durationMs": dict(progress.durationMs)})

            def onQueryIdle(self, event: Any) -> None:
                pass

            def onQueryTerminated(self, event: Any) -> None:
                pass

        spark.streams.addListener(Listener())

    def wait_for(self, name: str, batches: int, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        """The query's progress once ``batches`` reports arrived (they come asynchronously), or what came."""
        deadline = time.monotonic() + timeout_s
        while len(self.by_query.get(name, [])) < batches and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.by_query.pop(name, [])


def profiled(
    name: str, folder: Path, run: Callable[[], Any], events: int, progress: ProgressLog, *, rate: int, record: bool
) -> tuple[ProfiledRun, Any]:
    """Run ``run`` (a ``run_krishiv`` or ``run_events`` call, query ``name``) under py-spy and the CPU sampler."""
    stacks = folder / f"{name}.stacks.txt"
    with CpuSampler() as cpu, py_spy(stacks, rate) if record else _nothing():
        result = run()
    reports = progress.wait_for(name, result.batches)
    return (
        ProfiledRun(
            name,
            events,
            result.seconds,
            result.commit_s,
            result.batches,
            phase_seconds(reports),
            [p["durationMs"].get("triggerExecution", 0) / 1000 for p in reports],
            cpu.result.totals(),
            summarize_stacks(stacks, rate) if record else [],
        ),
        result,
    )


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def format_run(run: ProfiledRun, limit_eps: float) -> list[str]:
    eps = run.events / run.seconds
    lines = [
        f"== {run.name}: {run.events:,} events in {run.seconds:.2f} s = {eps:,.0f} ev/s "
        f"({eps / limit_eps:.3f} x raw consume); {run.batches} batches; relay {run.commit_s:.2f} s {run.extra}",
        "wall seconds per phase of Spark's query progress (summed over batches):",
    ]
    staged = run.seconds - run.commit_s
    accounted = sum(run.phases.get(p, 0.0) for p in PHASES)
    for phase in PHASES:
        if phase in run.phases:
            lines.append(f"  {phase:<16} {run.phases[phase]:8.2f} s")
    trigger = run.phases.get("triggerExecution", 0.0)
    lines.append(f"  {'triggerExecution':<16} {trigger:8.2f} s (the phases above: {accounted:.2f} s)")
    lines.append(f"  {'outside batches':<16} {staged - trigger:8.2f} s (query start, checks, leases, stop)")
    lines.append(f"  {'relay':<16} {run.commit_s:8.2f} s")
    lines.append("  per batch: " + ", ".join(f"{s:.2f}" for s in run.batch_seconds))
    lines.append("CPU seconds per process (user + system):")
    for kind, seconds in sorted(run.cpu.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {kind:<16} {seconds:8.2f} s")
    lines.append(f"  {'all':<16} {sum(run.cpu.values()):8.2f} s of {2 * run.seconds:.2f} s on 2 cores")
    return lines + run.stacks


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", help="pipeline spec file (default: $KRISHIV_SPEC or ./krishiv.toml)")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--batch-records", type=int, default=None, help="records per batch (default: the spec's)")
    parser.add_argument("--rate", type=int, default=SAMPLE_RATE_HZ, help="py-spy samples per second")
    parser.add_argument("--no-py-spy", action="store_true", help="time and CPU only (no sampling overhead)")
    parser.add_argument("--kinds", default="windowed,events", help="which Krishiv runs: windowed,events")
    parser.add_argument("--work", default="state/profile", help="working folder (emptied first)")
    parser.add_argument("--out", default="benchmarks/results/profile.txt", help="the text summary")
    parser.add_argument("--note", default="", help="a line to head the summary with (what changed)")
    args = parser.parse_args(argv)
    try:
        lines = profile(load_spec(args.spec), args)
    except KrishivError as exc:
        print(f"profile: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"written: {out}")
    return 0


def profile(spec: KrishivSpec, args: argparse.Namespace) -> list[str]:
    from benchmarks.raw_consume import raw_consume
    from benchmarks.throughput import bench_spec, events_spec, run_baseline, run_events, run_krishiv, run_scan_only
    from benchmarks.workload import produce_orders
    from krishiv.broker import start_broker
    from krishiv.state_folder import BENCH_MARKER, reset_folder
    from spark_jobs.session import build_session

    work = Path(args.work)
    reset_folder(work, BENCH_MARKER, command="python -m benchmarks.profile", label=str(work))
    base = replace(spec, kafka=replace(spec.kafka, partitions=args.partitions))
    batch = args.batch_records or base.pipeline().max_records_per_batch
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    lines = [
        f"python -m benchmarks.profile: {args.events:,} events, {args.partitions} partitions, {batch:,} records "
        f"per batch; {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}",
        f"machine: {os.cpu_count()} CPUs; load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
    ]
    if args.note:
        lines.append(args.note)
    with start_broker(log_path=work / "broker.log") as broker:

        def spec_for(name: str, topic: str) -> KrishivSpec:
            return bench_spec(base, work / name, broker.bootstrap, topic, batch)

        produce_orders(broker.bootstrap, "orders", args.events, seed=7, partitions=args.partitions)
        limit = raw_consume(broker.bootstrap, "orders")
        limit_eps = limit.events_per_s
        lines.append(f"raw consume: {limit_eps:,.0f} ev/s ({limit.seconds:.2f} s, {limit.readers} readers)")

        t0 = time.perf_counter()
        warmup = spec_for("warmup", "warmup")
        spark = build_session(warmup, "krishiv-profile")
        produce_orders(broker.bootstrap, "warmup", 20_000, seed=1, partitions=args.partitions)
        run_baseline(spark, warmup, 20_000)
        lines.append(f"Spark start-up and warm-up: {time.perf_counter() - t0:.2f} s (not profiled)")

        scan_s = run_scan_only(spark, spec_for("scan-only", "orders"), args.events)
        lines.append(
            f"scan only: {args.events / scan_s:,.0f} ev/s ({scan_s:.2f} s, "
            f"{args.events / scan_s / limit_eps:.3f} x raw)"
        )
        baseline = run_baseline(spark, spec_for("baseline", "orders"), args.events)
        lines.append(
            f"baseline (at-least-once): {baseline.events_per_s:,.0f} ev/s ({baseline.seconds:.2f} s, "
            f"{baseline.events_per_s / limit_eps:.3f} x raw)"
        )

        progress = ProgressLog(spark)
        runs: list[ProfiledRun] = []
        for kind in kinds:
            if kind == "windowed":
                s = spec_for("krishiv", "orders")
                call: Callable[[], Any] = lambda s=s: run_krishiv(spark, s, args.events)  # noqa: E731
            elif kind == "events":
                s = events_spec(spec_for("events", "orders"))
                call = lambda s=s: run_events(spark, s, args.events)  # noqa: E731
            else:
                raise KrishivError(f"--kinds: expected windowed and/or events, got {kind!r}")
            name = s.pipeline().name
            run, result = profiled(name, work, call, args.events, progress, rate=args.rate, record=not args.no_py_spy)
            if kind == "windowed":
                run.extra = f"({run.events / run.seconds / baseline.events_per_s:.3f} x baseline)"
            else:
                run.extra = (
                    f"({result.rows_written:,} rows written, {result.rows_per_s / limit_eps:.3f} x raw in rows/s)"
                )
            peak = result.peak_rss
            run.extra += (
                f"; peak RSS: JVM {peak.jvm_mb:,.0f} MB, Python workers {peak.python_workers_mb:,.0f} MB, "
                f"driver Python {peak.driver_python_mb:,.0f} MB"
            )
            runs.append(run)
        spark.stop()
    for run in runs:
        lines.append("")
        lines += format_run(run, limit_eps)
    lines.append("")
    lines.append(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return lines


if __name__ == "__main__":
    sys.exit(main())
