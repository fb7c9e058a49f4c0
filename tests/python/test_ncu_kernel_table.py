"""scripts/ncu_kernel_table.py: ncu's CSV (one row per kernel and metric) to one line per kernel.

The GPU side (scripts/gpu-kernels running ncu) needs the GPU machine; the parsing runs here.
"""

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location(
    "ncu_kernel_table", ROOT / "scripts" / "ncu_kernel_table.py"
)
table = importlib.util.module_from_spec(spec)
spec.loader.exec_module(table)

HEAD = (
    '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
    '"Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit",'
    '"Metric Value"'
)


def row(kid, name, metric, value):
    return (f'"{kid}","1","p","h","{name}","1","13","(128, 1, 1)","(8, 96, 1)","0","9.0",'
            f'"Command line profiler metrics","{metric}","x","{value}"')


def test_one_line_per_kernel_in_launch_order(tmp_path, capsys):
    gate_up = ("void modmoe::cuda::(anonymous namespace)::decode_gate_up_kernel<unsigned char, "
               "__nv_bfloat16>(modmoe::cuda::DecodeMlpArgs)")
    down = "modmoe::cuda::(anonymous namespace)::decode_down_kernel(modmoe::cuda::DecodeMlpArgs)"
    lines = ["==PROF== Connected to process 1", HEAD,
             row(1, down, "gpu__time_duration.sum", "9,300"),
             row(0, gate_up, "gpu__time_duration.sum", "14,500"),
             row(0, gate_up, "dram__bytes_read.sum", "25200000"),
             row(0, gate_up, "dram__bytes_write.sum", "400000"),
             row(0, gate_up, "dram__throughput.avg.pct_of_peak_sustained_elapsed", "36.5")]
    csv = tmp_path / "ncu.csv"
    csv.write_text("\n".join(lines) + "\n")
    assert table.main(str(csv)) == 0
    out = capsys.readouterr().out.splitlines()
    assert "decode_gate_up_kernel" in out[1] and out[1].split()[0] == "0"
    assert out[1].split()[2:] == ["14.5", "25.2", "0.4", "36.5"]
    assert "decode_down_kernel" in out[2] and out[2].split()[2] == "9.3"
    assert "2 kernels, 23.8 us" in out[3]


def test_no_kernel_rows_is_an_error_that_shows_ncu_output(tmp_path, capsys):
    csv = tmp_path / "ncu.csv"
    csv.write_text("==ERROR== the profiler could not find a GPU\n")
    assert table.main(str(csv)) == 1
    assert "could not find a GPU" in capsys.readouterr().out
