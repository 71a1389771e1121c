"""``scripts/faults`` / ``python -m tests.faults``: run fault scenarios and print the table.

Each scenario runs in a Python process of its own (Django is set up once per process,
with that scenario's Redis and settings), which writes its result as JSON; this process
collects them, prints the table, writes it to ``.faults/results.md`` (``--out``) and exits
with status 1 when a scenario failed: a message lost, a succeeded message the receiver
never got, or one of the scenario's own expectations not met.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .harness import DATA_DIR, ROOT, Result, _kill_everything, json_dump, table


def scenario_params(name: str, size: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The parameters of ``name`` at ``size`` (``"short"`` or ``"full"``) with ``overrides`` applied."""
    from .scenarios import SCENARIOS

    scenario = SCENARIOS[name]
    params = dict(scenario.short if size == "short" else scenario.full)
    params.update(overrides or {})
    return params


def run_child(
    name: str, size: str = "full", overrides: dict[str, Any] | None = None, timeout: float = 900
) -> Result:
    """Run one scenario in a new process and return its result.

    The child's output goes to ``.faults/<name>/driver.log``. A child that crashes or runs
    past ``timeout`` seconds gives a failed :class:`Result` saying so (its process group is
    killed, which ends the workers, the receiver and Redis it started).
    """
    log_dir = DATA_DIR / name
    log_dir.mkdir(parents=True, exist_ok=True)
    result_path = log_dir / "result.json"
    result_path.unlink(missing_ok=True)
    argv = [
        sys.executable,
        "-m",
        "tests.faults",
        "--child",
        name,
        "--size",
        size,
        "--result",
        str(result_path),
    ]
    argv += ["--params", json.dumps(overrides or {})]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    with open(log_dir / "driver.log", "wb") as log:
        child = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            child.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        finally:  # also on Ctrl-C: SIGTERM lets the child stop its workers, receiver and Redis
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGTERM)
                try:
                    child.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(child.pid, signal.SIGKILL)
                    child.wait()
    if result_path.exists():
        result = Result.from_dict(json.loads(result_path.read_text()))
    else:
        tail = (log_dir / "driver.log").read_text(errors="replace").splitlines()[-12:]
        result = Result(name)
        result.check(
            "the scenario ran to the end", False, f"exit status {child.returncode}; see {log_dir}/driver.log"
        )
        result.notes += tail
    result.elapsed_s = round(time.monotonic() - started, 1)
    return result


def child_main(name: str, size: str, params_json: str, result_path: str) -> int:
    """Run one scenario in this process; write its result to ``result_path``."""
    from .scenarios import SCENARIOS

    def terminate(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    params = scenario_params(name, size, json.loads(params_json))
    print(f"{name}: {params}", flush=True)
    try:
        result = SCENARIOS[name].function(name, **params)
    finally:
        _kill_everything()
    json_dump(result, Path(result_path))
    print(table([result]), flush=True)
    return 0


def parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def main(argv: Sequence[str] | None = None) -> int:
    from .scenarios import SCENARIOS

    parser = argparse.ArgumentParser(
        prog="scripts/faults",
        description="Run the fault suite: break Redis, workers and the receiver on purpose while "
        "messages flow, and count what was lost, duplicated and how long recovery took.",
        epilog="scenarios (--list shows their parameters):\n"
        + "\n".join(f"  {s.name:<22}{s.about}" for s in SCENARIOS.values())
        + "\n\nexit status: 0 when every scenario held, 1 when one lost a message, did not deliver a "
        "succeeded one, or missed one of its expectations (details under the table). Logs: .faults/<scenario>/",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("scenarios", nargs="*", metavar="SCENARIO", help="scenarios to run (default: all)")
    parser.add_argument("--short", action="store_true", help="the short sizes the pytest tests use")
    parser.add_argument(
        "--list", action="store_true", help="list the scenarios with their parameters and exit"
    )
    parser.add_argument(
        "-p", "--param", action="append", default=[], metavar="NAME=VALUE",
        help="override a parameter of every selected scenario that has it (JSON values), e.g. -p messages=500",
    )  # fmt: skip
    parser.add_argument(
        "--out",
        type=Path,
        default=DATA_DIR / "results.md",
        help="also write the table here (.faults/results.md)",
    )
    parser.add_argument(
        "--timeout", type=float, default=900, help="seconds one scenario may run before it is killed (900)"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--size", default="full", help=argparse.SUPPRESS)
    parser.add_argument("--params", default="{}", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child_main(args.child, args.size, args.params, args.result)
    size = "short" if args.short else "full"
    if args.list:
        for s in SCENARIOS.values():
            print(f"{s.name}\n    {s.about}\n    short: {s.short}\n    full:  {s.full or 'the defaults'}")
        return 0
    unknown = [n for n in args.scenarios if n not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; --list shows them")
    overrides: dict[str, Any] = {}
    for item in args.param:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--param needs NAME=VALUE, not {item!r}")
        overrides[key] = parse_value(value)
    results = []
    started = datetime.datetime.now(datetime.timezone.utc)
    for name in args.scenarios or list(SCENARIOS):
        import inspect

        accepted = inspect.signature(SCENARIOS[name].function).parameters
        mine = {k: v for k, v in overrides.items() if k in accepted}
        print(f"{name} ({size}{', ' + str(mine) if mine else ''}) ...", flush=True)
        result = run_child(name, size, mine, args.timeout)
        print(
            f"  {'ok' if result.ok else 'SKIPPED' if result.skipped else 'FAIL'} in {result.elapsed_s:.0f} s",
            flush=True,
        )
        results.append(result)
    text = table(results)
    print("\n" + text)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    header = (
        f"# Fault suite results\n\n{started:%Y-%m-%d %H:%M} UTC, {size} sizes, commit {commit or '?'}\n\n"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(header + text)
    print(f"written to {args.out}")
    return 0 if all(r.ok for r in results) else 1
