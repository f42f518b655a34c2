"""`lipstream export onnx` at full size with random weights: export time, file sizes, the gate's numbers.

    OMP_NUM_THREADS=2 .venv/bin/python -m benchmarks onnx_export [--tiny] [--dtypes float16 float32]
writes benchmarks/results/edge_export.json. Full size writes ~3.4 GB of random MuseTalk v1.5 weights in the
upstream layout to a temp folder first (not timed as export), then exports each dtype through the same code
as the CLI (load, trace, convert, shape inference, gate, manifest) and deletes everything unless --keep.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench_common import cpu_model  # noqa: E402

from lipstream.edge.onnx_export import OnnxExportConfig, export_onnx  # noqa: E402
from lipstream.edge.onnx_gate import default_inputs  # noqa: E402
from lipstream.engines.musetalk.topology import write_model_folder  # noqa: E402


def peak_rss_gb() -> float:
    """Peak resident memory of this process so far (GB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write its JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="the CI widths (seconds), not full size")
    parser.add_argument("--dtypes", nargs="+", default=["float16", "float32"], choices=["float16", "float32"])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--work", default=tempfile.gettempdir(), help="where the weights and exports go")
    parser.add_argument("--keep", action="store_true", help="keep the weights and exports")
    results = Path(__file__).resolve().parents[1] / "results"
    parser.add_argument("--out", default=str(results / "edge_export.json"))
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(dir=args.work, prefix="edge-export-bench-"))
    record: dict = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "load_avg_start": os.getloadavg(),
        "size": "tiny" if args.tiny else "full",
        "batch": args.batch,
        "runs": [],
    }
    try:
        t0 = time.perf_counter()
        models = write_model_folder(work / "models", versions=("1.5",), tiny=args.tiny, seed=0)
        record["write_weights_s"] = round(time.perf_counter() - t0, 1)
        record["weights_bytes"] = sum(p.stat().st_size for p in models.rglob("*") if p.is_file())
        inputs = default_inputs()
        for dtype in args.dtypes:
            out = work / f"onnx-{dtype}"
            t0 = time.perf_counter()
            manifest = export_onnx(OnnxExportConfig(models, "1.5", dtype, args.batch), out, inputs)
            elapsed = time.perf_counter() - t0
            sizes = {name: info["bytes"] for name, info in manifest["files"].items()}
            run = {
                "dtype": dtype,
                "export_s": round(elapsed, 1),
                "per_graph_s": {k: g["export_s"] for k, g in manifest["graphs"].items()},
                "bytes": sizes,
                "total_bytes": sum(sizes.values()),
                "gate": manifest["gate"],
                "peak_rss_gb": round(peak_rss_gb(), 2),
                "load_avg_after": os.getloadavg(),
            }
            record["runs"].append(run)
            print(f"{dtype}: export {run['export_s']} s, {run['total_bytes'] / 1e6:.1f} MB, "
                  f"gate {manifest['gate']['summary']}, peak RSS {run['peak_rss_gb']} GB", flush=True)
            if not args.keep:
                shutil.rmtree(out)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
