#!/usr/bin/env python3
"""Unit checks of bench/perf_report.py's table kinds on small synthetic JSON (written to a
temporary folder, not bench/results). Standard library only: runs on the CI machine.

    python3 tests/perf_report_test.py
"""
import contextlib
import importlib.util
import io
import json
import os
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location(
    "perf_report", os.path.join(ROOT, "bench", "perf_report.py"))
perf_report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(perf_report)


def slice_row(**over):
    r = {"context": 4096, "nodes": 16, "batch": 8, "step_ms": 40.0, "tokens_per_s": 3400.0,
         "attention_ms": 5.0, "gemm_ms": 12.5, "router_ms": 0.25, "dispatch_ms": 1.5,
         "experts_ms": 15.0, "sampling_ms": 0.75, "comm_ms": 0.0, "other_ms": 5.0,
         "gpu_ms": 39.5, "host_ms": 0.5, "collectives": 244, "comm_bytes": 123456789,
         "modeled_comm_ms": 8.0, "step_with_comm_ms": 48.0, "tokens_per_s_gpu": 2833.3,
         "tokens_per_s_host": 2833.4, "distinct_experts": 180, "floor_bytes": 1.2e11,
         "floor_ms": 30.0, "floor_fraction": 0.75, "fits": True}
    r.update(over)
    return r


def slice_json(rows):
    return {"bench": "engine", "impl": "verifyd",
            "meta": {"commit": "abc1234", "date": "2026-12-03", "device": "NVIDIA H200"},
            "model": "kimi-k2", "layers": 61, "slice": {"rank": 0, "world": 8},
            "comm_model": {"name": "nvlink4-nvswitch-8gpu-nccl-no-nvls",
                           "source": "nccl-tests busbw 370 GB/s"},
            "rows": rows}


class EngineSliceTest(unittest.TestCase):
    def render(self, d):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "slice.json")
            with open(path, "w") as f:
                json.dump(d, f)
            return perf_report.render("t", {"kind": "engine_slice", "engine": path})

    def test_row_uses_the_json_fields(self):
        lines = self.render(slice_json([slice_row()])).split("\n")
        self.assertTrue(lines[0].startswith(
            "| context | nodes | batch | step ms | modeled comm ms | step + comm ms |"))
        self.assertEqual(lines[0].count("|"), lines[1].count("|"))
        cells = [c.strip() for c in lines[2].strip("|").split("|")]
        self.assertEqual(len(cells), lines[0].count("|") - 1)
        # context, nodes, batch, step, modeled comm, step + comm, tokens/s per GPU and per host
        # as given (2833.3 / 2833.4, not recomputed), the split, distinct experts, floor ms,
        # % of floor = 30 / 40, host ms.
        self.assertEqual(cells, ["4,096", "16", "8", "40.00", "8.00", "48.00", "2833", "2833",
                                 "5.00", "12.50", "0.25", "1.50", "15.00", "0.75", "5.00",
                                 "180", "30.00", "75 %", "0.50"])
        text = "\n".join(lines)
        self.assertIn("rank 0 of 8", text)
        self.assertIn("nvlink4-nvswitch-8gpu-nccl-no-nvls", text)
        self.assertIn("nccl-tests busbw 370 GB/s", text)
        self.assertIn("commit `abc1234`", text)

    def test_throughputs_are_not_recomputed(self):
        cells = self.render(slice_json([slice_row(tokens_per_s_gpu=111.0,
                                                  tokens_per_s_host=888.0)])).split("\n")[2]
        self.assertIn("| 111 | 888 |", cells)

    def test_row_that_does_not_fit(self):
        row = {"context": 185000, "nodes": 64, "batch": 32, "fits": False}
        lines = self.render(slice_json([slice_row(), row])).split("\n")
        self.assertTrue(lines[3].startswith("| 185,000 | 64 | 32 | does not fit |"))
        self.assertEqual(lines[3].count("|"), lines[1].count("|"))
        self.assertNotIn("None", lines[3])

    def test_missing_field_is_named(self):
        row = slice_row()
        del row["modeled_comm_ms"]
        with contextlib.redirect_stderr(io.StringIO()):
            with self.assertRaises(SystemExit) as e:
                self.render(slice_json([slice_row(), row]))
        self.assertIn("rows[1] lacks 'modeled_comm_ms'", str(e.exception.code))
        d = slice_json([slice_row()])
        del d["comm_model"]
        with self.assertRaises(SystemExit) as e:
            self.render(d)
        self.assertIn("lacks 'comm_model'", str(e.exception.code))


if __name__ == "__main__":
    unittest.main()
