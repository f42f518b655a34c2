"""What a fresh clone costs before its first test runs (issue 24): the environment setup's time and disk.

For each `--ref LABEL=REF`: `git clone --branch REF` of this repository into /tmp/fresh-LABEL (replaced if
there), then `make` of every target `make test` needs before pytest starts: `setup`, plus `.venv-ray` and
`.venv-pipecat` where that checkout's Makefile still has them. The llama.cpp wheel in
~/.cache/lipstream/wheels is reused by both sides (built once per machine); pip's own cache is whatever the
machine has. Then the size of each environment folder (the face environment inside .venv on its own line).
`--measure LABEL=DIR` only measures the sizes of a clone already set up (its time then comes from where it
was run). Results are merged into benchmarks/results/env_setup_bench.json and printed side by side.

    .venv/bin/python -m benchmarks env_setup --ref before=main --ref after=oneenv
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

from bench_common import cpu_model

REPO = Path(__file__).resolve().parents[2]
RESULT = REPO / "benchmarks" / "results" / "env_setup_bench.json"
ENVIRONMENTS = (".venv", ".venv-pipecat", ".venv-ray")
FACE_ENV = ".venv/share/lipstream/face"


def disk_bytes(path: Path) -> int:
    """Bytes on disk under `path` (du), 0 if it is not there."""
    if not path.exists():
        return 0
    return int(
        subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True).stdout.split()[0]
    )


def sizes(clone: Path) -> dict[str, int]:
    """Each environment's size; .venv's without the face environment inside it."""
    found = {name: disk_bytes(clone / name) for name in ENVIRONMENTS if (clone / name).exists()}
    face = disk_bytes(clone / FACE_ENV)
    if face:
        found[".venv"] -= face
        found["face environment"] = face
    return found


def setup_targets(clone: Path) -> list[str]:
    """What `make test` builds before pytest: setup, and the extra venvs an older Makefile defines."""
    makefile = (clone / "Makefile").read_text()
    return [
        "setup",
        *[f"{name}/.installed" for name in (".venv-ray", ".venv-pipecat") if f":= {name}\n" in makefile],
    ]


def run_side(label: str, ref: str) -> dict:
    """Clone `ref` afresh, time its setup, measure its environments."""
    clone = Path(f"/tmp/fresh-{label}")
    shutil.rmtree(clone, ignore_errors=True)
    subprocess.run(["git", "clone", "-q", "--branch", ref, str(REPO), str(clone)], check=True)
    targets = setup_targets(clone)
    env = {**os.environ, "LIPSTREAM_HOME": str(clone / "out" / "home")}
    started = time.perf_counter()
    done = subprocess.run(["make", *targets], cwd=clone, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{label}: make {' '.join(targets)} failed:\n{done.stderr[-3000:]}")
    commit = subprocess.run(["git", "-C", str(clone), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()  # fmt: skip
    return {
        "ref": ref,
        "commit": commit,
        "command": f"make {' '.join(targets)}",
        "seconds": round(seconds, 1),
        "sizes": sizes(clone),
        "load_after": os.getloadavg()[0],
    }


def main(argv: list[str] | None = None) -> int:
    """Run or measure the sides asked for; print every side the results file holds."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ref", action="append", default=[], help="LABEL=REF: clone REF and time its setup")
    parser.add_argument("--measure", action="append", default=[], help="LABEL=DIR: only measure DIR's sizes")
    args = parser.parse_args(argv)
    results = json.loads(RESULT.read_text()) if RESULT.exists() else {}
    results.update({"cpu": cpu_model(), "date": datetime.now(timezone.utc).isoformat(timespec="seconds")})
    sides = results.setdefault("sides", {})
    for pair in args.ref:
        label, ref = pair.split("=", 1)
        sides[label] = run_side(label, ref)
    for pair in args.measure:
        label, folder = pair.split("=", 1)
        sides.setdefault(label, {})["sizes"] = sizes(Path(folder))
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps(results, indent=2) + "\n")
    names = sorted({name for side in sides.values() for name in side.get("sizes", {})})
    print(f"{cpu_model()}; sizes in MB (du)")
    print(f"{'':10} {'setup s':>8} " + " ".join(f"{n:>17}" for n in names) + f" {'total':>8}")
    for label, side in sides.items():
        got = side.get("sizes", {})
        cells = " ".join(f"{got.get(n, 0) / 1e6:>17.0f}" for n in names)
        print(f"{label:10} {side.get('seconds', float('nan')):>8} {cells} {sum(got.values()) / 1e6:>8.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
