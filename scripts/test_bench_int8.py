"""Unit tests of bench_int8.py's arithmetic (the goal of a row, the peak kept, the fractions), of
bench_models.py's table and of runtime_goals.py's verdicts.

    python3 -m unittest scripts/test_bench_int8.py

Standard library only (bench_int8 imports no third-party module at load time); `.ci/run` runs it.
"""

from __future__ import annotations

import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_int8  # noqa: E402
import bench_models  # noqa: E402
import runtime_goals  # noqa: E402

PEAK = {"int8_peak_gops": 1000.0, "source": "test",
        "best_int8_kernel": {"kernel": "avx512vnni", "gops": 900.0, "fraction_of_peak": 0.9}}


def engines(ours_seq_s: float, ours_p50: float, ov_seq_s: float, ov_p50: float) -> dict:
    return {"encore-int8-static-attn": {"seq_per_s": ours_seq_s, "p50_ms": ours_p50},
            "openvino-int8-nncf": {"seq_per_s": ov_seq_s, "p50_ms": ov_p50}}


class GoalRow(unittest.TestCase):
    def test_throughput_goal_and_what_it_needs_of_the_peak(self):
        # 10 GMAC per batch of 8; 1.25 x 40 = 50 seq/s = 125 GOPS... of a 1000 GOPS peak.
        g = bench_int8.goal_row(8, 10 * 10**9, engines(45.0, 180.0, 40.0, 200.0), PEAK)
        self.assertEqual(g["kind"], "throughput")
        self.assertAlmostEqual(g["target_seq_per_s"], 50.0)
        self.assertAlmostEqual(g["best_ratio"], 45.0 / 40.0)
        self.assertFalse(g["met"])
        self.assertAlmostEqual(g["needed_fraction_of_int8_peak"], 2 * 10e9 * 50.0 / 8 / 1e9 / 1000.0)
        self.assertAlmostEqual(g["share_left_beside_bare_gemms"], 1 - 0.125 / 0.9)
        g = bench_int8.goal_row(8, 10 * 10**9, engines(51.0, 150.0, 40.0, 200.0), PEAK)
        self.assertTrue(g["met"])

    def test_latency_goal_at_batch_1(self):
        g = bench_int8.goal_row(1, 10**9, engines(30.0, 30.0, 25.0, 40.0), PEAK)
        self.assertEqual(g["kind"], "latency")
        self.assertAlmostEqual(g["target_p50_ms"], 32.0)
        self.assertTrue(g["met"])
        # 1 GMAC in 32 ms: 62.5 GOPS of 1000.
        self.assertAlmostEqual(g["needed_fraction_of_int8_peak"], 2e9 / 0.032 / 1e9 / 1000.0)
        g = bench_int8.goal_row(1, 10**9, engines(30.0, 33.0, 25.0, 40.0), PEAK)
        self.assertFalse(g["met"])

    def test_no_goal_without_the_peer_or_without_encore(self):
        self.assertIsNone(bench_int8.goal_row(8, 10**9, {"openvino-int8-nncf": {"seq_per_s": 1, "p50_ms": 1}}, PEAK))
        self.assertIsNone(bench_int8.goal_row(8, 10**9, {"encore-int8": {"seq_per_s": 1, "p50_ms": 1}}, PEAK))

    def test_without_a_peak_the_goal_still_says_met_or_not(self):
        g = bench_int8.goal_row(8, 10**9, engines(45.0, 180.0, 40.0, 200.0), None)
        self.assertNotIn("needed_fraction_of_int8_peak", g)
        self.assertFalse(g["met"])


class VnniRoofline(unittest.TestCase):
    def test_the_vpdpbusd_peak_behind_the_best_vnni_row(self):
        rows = [{"kernel": "amx", "dtype": "int8", "gops": 3000.0, "fraction_of_peak": 0.2},
                {"kernel": "avx512vnni", "dtype": "int8", "gops": 800.0, "fraction_of_peak": 0.8},
                {"kernel": "avxvnni", "dtype": "int8", "gops": 300.0, "fraction_of_peak": 0.6},
                {"kernel": "f32-avx512", "dtype": "f32", "gops": 200.0, "fraction_of_peak": 0.8}]
        self.assertAlmostEqual(bench_int8.vnni_peak_of(rows), 1000.0)
        self.assertIsNone(bench_int8.vnni_peak_of(rows[:1]))

    def test_engines_rated_against_both_peaks(self):
        class Args:
            batch_list = [8]
            lengths_from = None
            seq = 128
            facts: dict = {}
        ms = [{"throughput_seq_per_s": 100.0, "latency_ms_p50": 80.0}]
        rows = {8: {"encore-int8-static-attn": ms, "openvino-int8-nncf": ms}}
        peak = dict(PEAK, int8_peak_gops=10000.0, vnni_peak_gops=2000.0)
        s = bench_int8.summarize(Args, rows, peak)[0]["engines"]["encore-int8-static-attn"]
        self.assertAlmostEqual(s["fraction_of_vnni_peak"] / s["fraction_of_int8_peak"], 5.0)
        s = bench_int8.summarize(Args, rows, PEAK)[0]["engines"]["encore-int8-static-attn"]
        self.assertNotIn("fraction_of_vnni_peak", s)


class RemeasurePeak(unittest.TestCase):
    def setUp(self):
        self.saved = bench_int8.int8_peak

    def tearDown(self):
        bench_int8.int8_peak = self.saved

    def test_the_higher_peak_and_the_faster_bare_gemm_are_kept(self):
        # A busy first measurement (the loop at half speed) and a quiet second one.
        first = {"int8_peak_gops": 470.0, "source": "first",
                 "best_int8_kernel": {"kernel": "avx512vnni", "gops": 460.0, "fraction_of_peak": 0.98}}
        second = {"int8_peak_gops": 930.0, "source": "second",
                  "best_int8_kernel": {"kernel": "avx512vnni", "gops": 870.0, "fraction_of_peak": 0.935}}
        bench_int8.int8_peak = lambda args, encore: dict(second)
        kept = bench_int8.remeasure_peak(None, None, first)
        self.assertEqual(kept["int8_peak_gops"], 930.0)
        self.assertEqual(kept["measured_gops"], [470.0, 930.0])
        self.assertAlmostEqual(kept["best_int8_kernel"]["fraction_of_peak"], 870.0 / 930.0)
        # The other way round: the first kept, the bare GEMM from whichever run was faster.
        bench_int8.int8_peak = lambda args, encore: dict(first)
        kept = bench_int8.remeasure_peak(None, None, second)
        self.assertEqual(kept["int8_peak_gops"], 930.0)
        self.assertAlmostEqual(kept["best_int8_kernel"]["gops"], 870.0)

    def test_a_failed_second_measurement_keeps_the_first(self):
        def fail(args, encore):
            raise bench_int8.BenchError("no hwbench")
        bench_int8.int8_peak = fail
        self.assertIs(bench_int8.remeasure_peak(None, None, PEAK), PEAK)


class _Str:
    def __init__(self, v: str):
        self.v = v

    def astype(self, _t):
        return self.v


class _Op:
    def __init__(self, layer: str, prim: str | None):
        self.rt = {"layerType": _Str(layer)}
        if prim is not None:
            self.rt["primitiveType"] = _Str(prim)

    def get_rt_info(self):
        return self.rt


class _Compiled:
    def __init__(self, ops):
        self.ops = ops

    def get_runtime_model(self):
        if self.ops is None:
            raise RuntimeError("no runtime model")
        return self

    def get_ops(self):
        return self.ops


class OpenVinoPrimitives(unittest.TestCase):
    def test_gemm_nodes_counted_by_primitive(self):
        ops = [_Op("FullyConnected", "brgemm_avx512_amx_I8")] * 3 + [_Op("MatMul", "brgemm_avx512_i8"),
                                                                    _Op("Softmax", "jit_avx512"),
                                                                    _Op("FullyConnected", None)]
        self.assertEqual(bench_int8.gemm_primitives(_Compiled(ops)),
                         {"FullyConnected:?": 1, "FullyConnected:brgemm_avx512_amx_I8": 3,
                          "MatMul:brgemm_avx512_i8": 1})

    def test_without_a_runtime_model_it_says_so(self):
        self.assertIn("unavailable", bench_int8.gemm_primitives(_Compiled(None)))


class IsaCaps(unittest.TestCase):
    def test_only_the_variables_set_are_reported(self):
        saved = {v: bench_int8.os.environ.pop(v, None) for v in bench_int8.ISA_CAP_VARS}
        try:
            self.assertEqual(bench_int8.isa_caps(), {})
            bench_int8.os.environ["ONEDNN_MAX_CPU_ISA"] = "AVX512_CORE_BF16"
            self.assertEqual(bench_int8.isa_caps(), {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"})
        finally:
            for v, old in saved.items():
                bench_int8.os.environ.pop(v, None)
                if old is not None:
                    bench_int8.os.environ[v] = old


if __name__ == "__main__":
    unittest.main()


class FamilyTable(unittest.TestCase):
    """bench_models.py's table: the runtime issue's figures per row, from bench_int8's JSON."""

    def write_run(self, out: Path, tag: str, summary: list, caps: dict) -> None:
        import json

        machine = {"cpu": {"model": "Test CPU"}, "isa_caps": caps}
        (out / f"bert-base-{tag}.json").write_text(json.dumps({"machine": machine, "summary": summary}))

    def test_best_engine_ratios_roofline_and_goal(self):
        import tempfile

        batch8 = {"encore-int8": {"seq_per_s": 70.0, "p50_ms": 120.0, "fraction_of_int8_peak": 0.5},
                  "encore-int8-static-attn": {"seq_per_s": 100.0, "p50_ms": 80.0,
                                              "fraction_of_int8_peak": 0.1, "fraction_of_vnni_peak": 1.3},
                  "openvino-int8-nncf": {"seq_per_s": 80.0, "p50_ms": 100.0, "fraction_of_int8_peak": 0.7},
                  "encore-fp32": {"seq_per_s": 10.0, "p50_ms": 800.0}}
        goal = bench_int8.goal_row(8, 10**10, batch8, None)
        with tempfile.TemporaryDirectory() as d:
            out = Path(d)
            self.write_run(out, "s128", [{"batch": 8, "engines": batch8, "goal": goal}],
                           {"ENCORE_KERNEL": "avx512vnni"})
            rows, machine = bench_models.load_rows(out, ["bert-base"])
            self.assertEqual(len(rows), 1)
            r = rows[0]
            self.assertEqual(r["best_int8"], "encore-int8-static-attn")
            self.assertAlmostEqual(r["p50_ratio"], 0.8)
            # The tile peak's fraction (0.1) is not the issue's roofline: the vpdpbusd one is.
            self.assertEqual(r["roofline"], (1.3, 0.7))
            bench_models.write_table(rows, machine, out / "speed.md")
            table = (out / "speed.md").read_text()
        self.assertIn("ENCORE_KERNEL=avx512vnni", table)
        line = [x for x in table.splitlines() if x.startswith("| bert-base | 128 | 8 |")][0]
        self.assertIn("| 1.25x | 0.80x | 10.00x | 130 % / 70 % | 1.25x >= 1.25x: met |", line)

    def test_a_row_without_encore_or_peer_says_so(self):
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            out = Path(d)
            self.write_run(out, "s384", [{"batch": 1, "engines": {
                "ort-fp32": {"seq_per_s": 3.0, "p50_ms": 330.0}}, "goal": None}], {})
            rows, machine = bench_models.load_rows(out, ["bert-base"])
            bench_models.write_table(rows, machine, out / "speed.md")
            line = (out / "speed.md").read_text().splitlines()[-1]
        self.assertTrue(line.startswith("| bert-base | 384 | 1 |"))
        self.assertTrue(line.endswith("| - | - | - | - / - | - |"), line)


class RuntimeGoals(unittest.TestCase):
    """runtime_goals.py's verdicts from each step's output."""

    def test_model_rows_give_latency_throughput_and_roofline_goals(self):
        rows = [{"model": "bert-base", "seq": 128, "batch": 1, "roofline": (1.1, 0.7),
                 "goal": {"kind": "latency", "ratio": 0.8, "best_ratio": 0.63, "best_engine": "e", "met": True}},
                {"model": "bert-base", "seq": 128, "batch": 8, "roofline": (0.79, 0.5),
                 "goal": {"kind": "throughput", "ratio": 1.25, "best_ratio": 1.3, "best_engine": "e", "met": True}},
                {"model": "bert-base", "seq": 128, "batch": 32, "roofline": (None, None), "goal": None}]
        goals = runtime_goals.model_goals(rows)
        self.assertEqual([g["met"] for g in goals], [True, True, False, False])
        self.assertIn("79% (OpenVINO 50%)", goals[2]["figure"])
        self.assertEqual(goals[3]["figure"], "not measured")
        # Rows bench_models.py should have measured and did not are goals not met.
        missing = runtime_goals.model_goals(rows, ["bert-base", "xlm-roberta-base"])
        self.assertEqual(len(missing), 4 + 1 + 4)
        self.assertEqual([g["goal"] for g in missing[:1]], ["bert-base seq 384 batch 1: beside OpenVINO INT8"])
        self.assertFalse(any(g["met"] for g in missing[:5]))

    def test_padding_free_ratio_of_the_best_engine(self):
        summary = [{"batch": 32, "mean_real_tokens": 27.6, "mean_padded_tokens": 51.4, "engines": {
            "encore-int8-static-attn": {"seq_per_s": 500.0}, "encore-int8": {"seq_per_s": 300.0},
            "openvino-int8-nncf": {"seq_per_s": 200.0}}}]
        g = runtime_goals.padding_free_goal(summary)
        self.assertAlmostEqual(g["ratio"], 2.5)
        self.assertTrue(g["met"])
        summary[0]["engines"]["openvino-int8-nncf"]["seq_per_s"] = 251.0
        self.assertFalse(runtime_goals.padding_free_goal(summary)["met"])
        del summary[0]["engines"]["openvino-int8-nncf"]
        self.assertFalse(runtime_goals.padding_free_goal(summary)["met"])

    def test_memory_lowest_means_every_encore_figure_below_every_peer(self):
        out = ("encore INT8 dynamic (.encore)        218.6 MiB\n"
               "encore INT8 static (.encore)         203.7 MiB\n"
               "python + onnxruntime imported         45.0 MiB\n"
               "onnxruntime INT8 dynamic             263.3 MiB\n"
               "OpenVINO INT8 (NNCF)                 454.9 MiB\n")
        g = runtime_goals.memory_goal(out)
        self.assertTrue(g["met"])
        self.assertEqual(len(g["mib"]), 5)
        self.assertNotIn("python", g["figure"])
        self.assertFalse(runtime_goals.memory_goal(out.replace("263.3", "210.0"))["met"])
        self.assertFalse(runtime_goals.memory_goal("OpenVINO INT8 (NNCF)  454.9 MiB\n")["met"])

    def test_load_time_and_jit(self):
        out = "/m.encore: Model::load 0.001 s, Session build 0.111 s, first run (1x128) 0.014 s  (median of 5; 2 threads)"
        self.assertTrue(runtime_goals.load_goal(out)["met"])
        self.assertFalse(runtime_goals.load_goal(out.replace("0.111", "0.499"))["met"])
        with self.assertRaises(runtime_goals.BenchError):
            runtime_goals.load_goal("nothing")
        self.assertTrue(runtime_goals.jit_goal({"jit_compile_ms": 1.5, "jit_units": 4})["met"])
        g = runtime_goals.jit_goal({"jit_compile_ms": None, "jit_unavailable": "no executable memory"})
        self.assertFalse(g["met"])
        self.assertIn("no executable memory", g["figure"])

    def test_kernels_judged_against_the_vpdpbusd_peak_of_each_table(self):
        def table(n, picked_kernel, picked_gops):
            return [{"kernel": "avx512vnni", "dtype": "int8", "n": n, "k": 768, "gops": 800.0,
                     "fraction_of_peak": 0.8, "picked": picked_kernel == "avx512vnni"},
                    {"kernel": "amx", "dtype": "int8", "n": n, "k": 768, "gops": picked_gops,
                     "fraction_of_peak": 0.3, "picked": picked_kernel == "amx"},
                    {"kernel": "f32-avx512", "dtype": "f32", "n": n, "k": 768, "gops": 150.0,
                     "fraction_of_peak": 0.75, "picked": True}]
        # AMX at 2.7x the vpdpbusd peak (1000 GOPS) passes; the VNNI kernel at 80 % does not.
        int8, f32 = runtime_goals.kernel_goals([table(768, "amx", 2700.0)])
        self.assertTrue(int8["met"])
        self.assertFalse(f32["met"])
        self.assertIn("f32-avx512 N=768 K=768 75%", f32["figure"])
        int8, _ = runtime_goals.kernel_goals([table(768, "amx", 2700.0), table(3072, "avx512vnni", 0.0)])
        self.assertFalse(int8["met"])
        self.assertIn("avx512vnni N=3072 K=768 80%", int8["figure"])
        _, f32 = runtime_goals.kernel_goals([table(768, "amx", 2700.0)], [{"n": 768, "k": 768, "gflops": 160.0}])
        self.assertIn("(PyTorch's own GEMM on the same shapes: 80%-80%)", f32["figure"])
        fast = table(768, "amx", 2700.0)
        fast[2]["fraction_of_peak"] = 0.86
        self.assertTrue(runtime_goals.kernel_goals([fast])[1]["met"])
        self.assertFalse(any(g["met"] for g in runtime_goals.kernel_goals([[]])))

    def test_fp32_beside_torch_needs_batch_8_and_32(self):
        s = [{"batch": b, "ratio_encore_over_torch": r, "encore_seq_per_s": 10 * r, "torch_seq_per_s": 10.0}
             for b, r in ((1, 0.9), (8, 1.06), (32, 1.01))]
        self.assertTrue(runtime_goals.fp32_goal(s)["met"])
        self.assertFalse(runtime_goals.fp32_goal(s[:2])["met"])
        s[2]["ratio_encore_over_torch"] = 0.99
        self.assertFalse(runtime_goals.fp32_goal(s)["met"])

    def test_report_counts_verdicts_and_failed_steps(self):
        import tempfile

        report = {"cpu": {"model": "Test CPU", "flags": {"avx512_vnni": True, "amx_int8": False}}, "goals": [
            {"part": 2, "goal": "a", "figure": "1", "met": True},
            {"part": 6, "goal": "b", "figure": "2", "met": None},
            {"part": 8, "goal": "c", "figure": "3", "met": False}],
            "failed": {"memory": "StepError: exit 1"}, "skipped": ["fp32-torch"], "commands": ["x y"]}
        with tempfile.TemporaryDirectory() as d:
            runtime_goals.write_report(report, Path(d) / "goals.md")
            text = (Path(d) / "goals.md").read_text()
        self.assertIn("CPU flags: avx512_vnni;", text)
        self.assertIn("| 8 | c | 3 | NOT met |", text)
        self.assertIn("| 6 | b | 2 | - |", text)
        self.assertIn("| - | step `memory` | failed: StepError: exit 1 | NOT met |", text)
        self.assertIn("1 of 2 goals met, 1 step(s) failed.", text)
        self.assertIn("Skipped: fp32-torch.", text)
