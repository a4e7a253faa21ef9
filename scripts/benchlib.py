"""Shared steps of the benchmark scripts (bench_fp32_vs_ort.py, bench_fp32_torch.py, bench_int8.py):
errors, logging, running commands, the common arguments' checks, the work folder, the
self-installing virtualenv, building the encore CLI and the model, and the machine facts every
figure is reported with."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# The log prefix: each script sets its own name.
PROG = "bench"


class BenchError(Exception):
    """A step failed; the message says which and why."""


def log(msg: str) -> None:
    print(f"[{PROG} {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def tail(text: str | bytes | None, lines: int = 30) -> str:
    if text is None:
        return ""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return "\n".join(text.strip().splitlines()[-lines:])


def run_cmd(cmd: list[str], what: str, timeout: float, cwd: Path = REPO, show_stdout: bool = True) -> str:
    """Runs `cmd` and returns its stdout; raises BenchError naming `what` on a missing program,
    timeout or failure. The error shows the end of stderr, and of stdout unless `show_stdout` is
    false."""
    log(f"{what}: {' '.join(cmd)}")
    try:
        p = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout, check=False)
    except FileNotFoundError as e:
        raise BenchError(f"{what}: cannot run {cmd[0]!r}: {e}") from e
    except subprocess.TimeoutExpired as e:
        raise BenchError(
            f"{what}: timed out after {timeout:.0f} s (raise --timeout)\n{tail(e.stdout)}\n{tail(e.stderr)}"
        ) from e
    if p.returncode != 0:
        out = f"\n--- stdout ---\n{tail(p.stdout)}" if show_stdout else ""
        raise BenchError(f"{what}: exit status {p.returncode}{out}\n--- stderr ---\n{tail(p.stderr)}")
    return p.stdout.decode("utf-8", "replace")


def load_1m() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def check_batches_and_counts(p: argparse.ArgumentParser, args: argparse.Namespace,
                             counts: tuple[str, ...] = ("seq", "threads", "rounds")) -> None:
    """Sets `args.batch_list` from `--batches` (comma-separated positive integers) and checks
    that each option named in `counts` is at least 1; a bad value ends the script with a usage
    error naming it."""
    try:
        args.batch_list = [int(b) for b in args.batches.split(",") if b.strip()]
    except ValueError:
        p.error(f"--batches {args.batches!r} is not a comma-separated list of integers")
    if not args.batch_list or min(args.batch_list) < 1:
        p.error("--batches needs positive integers")
    for name in counts:
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")


@contextlib.contextmanager
def work_folder(args: argparse.Namespace, prefix: str) -> Iterator[Path]:
    """`args.workdir` (made if missing, kept after), or a temporary folder removed after."""
    if args.workdir:
        workdir = Path(args.workdir).resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        yield workdir
    else:
        with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
            yield Path(tmp)


def ensure_venv(script: str, args: argparse.Namespace, requirements: Path, marker: str) -> None:
    """Re-executes `script` inside the venv `args.venv`, creating it and installing
    `requirements` first if needed; nothing with `args.no_venv` or once inside (`marker` set)."""
    if args.no_venv or os.environ.get(marker) == "1":
        return
    venv = Path(args.venv).resolve()
    py = venv / "bin" / "python"
    stamp = venv / ".requirements-installed"
    wanted = requirements.read_text()
    if not py.exists():
        log(f"creating virtualenv {venv}")
        run_cmd([sys.executable, "-m", "venv", str(venv)], "python3 -m venv", timeout=300)
    if not stamp.exists() or stamp.read_text() != wanted:
        run_cmd(
            [str(py), "-m", "pip", "install", "--disable-pip-version-check", "-q", "-r", str(requirements)],
            f"pip install -r {requirements.relative_to(REPO)}",
            timeout=args.timeout,
        )
        stamp.write_text(wanted)
    env = dict(os.environ, **{marker: "1"})
    log(f"re-running inside {venv}")
    os.execve(str(py), [str(py), str(Path(script).resolve()), *sys.argv[1:]], env)


def encore_executable(args: argparse.Namespace) -> Path:
    """`args.encore_bin`, or the `encore` that `cargo build --release --bin encore` makes."""
    if args.encore_bin:
        exe = Path(args.encore_bin).resolve()
        if not exe.exists():
            raise BenchError(f"--encore-bin {exe} does not exist")
        return exe
    if shutil.which("cargo") is None:
        raise BenchError("cargo is not on PATH (or pass --encore-bin)")
    out = run_cmd(
        ["cargo", "build", "--release", "--bin", "encore", "--message-format=json-render-diagnostics"],
        "cargo build --release --bin encore",
        timeout=args.timeout,
        show_stdout=False,  # cargo's JSON messages; the diagnostics are on stderr
    )
    exe = None
    for line in out.splitlines():
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            continue
        if msg.get("reason") == "compiler-artifact" and msg.get("executable") and msg["target"]["name"] == "encore":
            exe = Path(msg["executable"])
    if exe is None or not exe.exists():
        raise BenchError("cargo build finished but reported no `encore` executable")
    return exe


def build_model(args: argparse.Namespace, encore: Path, workdir: Path, extra: list[str] | None = None) -> Path:
    """`args.model`, or `encore build-model --preset args.preset` (plus `extra` flags) into `workdir`."""
    if args.model:
        model = Path(args.model).resolve()
        if not model.exists():
            raise BenchError(f"--model {model} does not exist")
        return model
    model = workdir / f"{args.preset}.onnx"
    t0 = time.perf_counter()
    run_cmd([str(encore), "build-model", "--preset", args.preset, "--out", str(model), *(extra or [])],
            "encore build-model", timeout=args.timeout)
    log(f"wrote {model} ({model.stat().st_size / 1e6:.1f} MB) in {time.perf_counter() - t0:.1f} s")
    return model


def git_commit() -> str | None:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10
        ).stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


def cpu_model() -> str:
    """The `model name` of /proc/cpuinfo (else platform.processor())."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()
