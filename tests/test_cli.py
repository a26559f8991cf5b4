import json

import pytest

from extender.cli import main

NODES = "sn,cpu_milli,memory_mib,gpu,model\n" + "".join(
    f"n{i},32000,131072,{g},{m}\n" for i, (g, m) in enumerate([(2, "T4"), (8, "G2"), (4, "V100M16"), (1, "P100")] * 10)
)
HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
PODS = HEADER + "".join(
    f"p{i},{1000 + 500 * (i % 3)},2048,{g},{m},{spec},LS,Running,{10 * i},{10 * i + 600},{10 * i}\n"
    for i, (g, m, spec) in enumerate([(1, 500, ""), (1, 1000, ""), (0, 0, ""), (2, 1000, ""), (1, 250, "T4"), (1, 810, "")] * 20)
)


@pytest.fixture
def csvs(tmp_path):
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "openb_pod_list_tiny.csv"
    nodes.write_text(NODES)
    pods.write_text(PODS)
    return str(nodes), str(pods)


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_packing_json_has_one_line_per_trace_policy_scheduler_seed(csvs, capsys, tmp_path):
    nodes, pods = csvs
    png = tmp_path / "p.png"
    code, out, _ = run(capsys, "simulate", "--trace", pods, "--nodes", nodes, "--policy", "fgd,tessera",
                       "--seeds", "1-2", "--json", "--plot", str(png), "--workers", "1")
    assert code == 0
    records = [json.loads(line) for line in out.splitlines()]
    assert len(records) == 2 * 2 * 2
    assert {(r["policy"], r["scheduler"], r["seed"]) for r in records} == {
        (p, s, seed) for p in ("fgd", "tessera") for s in ("ideal", "kube") for seed in (1, 2)
    }
    for r in records:
        assert r["trace"] == "tiny"
        assert set(r["unallocated_pct"]) <= {str(x) for x in range(50, 131)} and "100" in r["unallocated_pct"]
        assert all(0 <= v <= 100 for v in r["unallocated_pct"].values())
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_time_mode_table_and_json(csvs, capsys):
    nodes, pods = csvs
    code, out, _ = run(capsys, "simulate", "--mode", "time", "--trace", pods, "--nodes", nodes, "--policy",
                       "k8s-default,tessera", "--load", "0.2,0.4", "--seeds", "3", "--json", "--plot", "none",
                       "--workers", "1")
    assert code == 0
    records = [json.loads(line) for line in out.splitlines()]
    assert len(records) == 2 * 2 * 2
    for r in records:
        assert {"wait_mean_s", "wait_p50_s", "wait_p99_s", "gpu_alloc_mean_pct", "trace", "seed"} <= set(r)
        assert r["wait_p50_s"] <= r["wait_p99_s"] <= r["wait_max_s"]
        # the tiny trace's classes: 20 pods each of slice x3 (500, 250, 810 milli), 1 GPU, CPU-only, 2 GPUs
        assert {c: s["pods"] for c, s in r["classes"].items()} == {"cpu": 20, "slice": 60, "1gpu": 20, "2gpu": 20}
        assert max(s["max_s"] for s in r["classes"].values()) == r["wait_max_s"]
        assert r["declarations"] == "users"  # the default: run times as users declare them (issue 37)
    code, out, _ = run(capsys, "simulate", "--mode", "time", "--trace", pods, "--nodes", nodes, "--policy", "fgd",
                       "--load", "0.5", "--seeds", "3", "--scheduler", "ideal", "--plot", "none", "--workers", "1")
    assert code == 0 and "wait mean" in out and "fgd" in out
    table = out[out.index("Waits per pod class"):].split("\n\n")[0]
    rows = [line.split() for line in table.splitlines()[2:]]
    assert [r[2] for r in rows] == ["cpu", "slice", "1gpu", "2gpu"] and all(r[:2] == ["0.50", "fgd"] for r in rows)


def test_time_mode_runs_shortest_runs_first_for_tessera_only_unless_told(csvs, capsys):
    """Shipped on (issue 37): the tessera rows run it, the baselines run as their systems do; --short-first on puts it in
    every row, --short-first off in none; estimates only when asked."""
    nodes, pods = csvs

    def rules(*flags: str) -> dict[str, dict | None]:
        code, out, _ = run(capsys, "simulate", "--mode", "time", "--trace", pods, "--nodes", nodes, "--policy",
                           "k8s-default,fgd,tessera", "--scheduler", "kube", "--load", "0.4", "--seeds", "3", "--json",
                           "--workers", "1", *flags)
        assert code == 0
        return {r["policy"]: r.get("short_first") for r in map(json.loads, out.splitlines())}

    shipped = rules()
    assert shipped["k8s-default"] is None and shipped["fgd"] is None
    assert shipped["tessera"]["estimate_silent"] is False and shipped["tessera"]["waiting"] == 20
    assert all(r is not None for r in rules("--short-first", "on").values())
    assert all(r is None for r in rules("--short-first", "off").values())
    assert rules("--short-first-estimate", "on")["tessera"]["estimate_silent"] is True


def test_the_time_plot_has_a_panel_for_all_pods_and_one_per_class(csvs):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from extender.sim.plot import time_figure
    from extender.sim.runner import Job, run_job

    nodes, pods = csvs
    results = [run_job(Job(trace=pods, nodes=nodes, policy=p, scheduler="ideal", seed=3, mode="time", load=load))
               for p in ("fgd", "tessera") for load in (0.3, 0.6)]
    fig = time_figure(results)
    panels = {ax.get_title(): ax for ax in fig.axes if ax.get_visible()}
    assert list(panels) == ["all pods", "cpu", "slice", "1gpu", "2gpu"]
    for title, ax in panels.items():
        lines = {line.get_label(): list(line.get_ydata()) for line in ax.lines}
        for policy in ("fgd", "tessera"):
            want = [(r.wait_mean_s if title == "all pods" else r.classes[title].mean_s) / 60
                    for r in results if r.policy == policy]
            assert lines[f"{policy} (ideal)"] == pytest.approx(want), (title, policy)
    plt.close(fig)


@pytest.mark.parametrize(
    "argv, words",
    [
        (["simulate", "--policy", "nope"], "unknown policy nope"),
        (["simulate", "--scheduler", "fast"], "unknown scheduler fast"),
        (["simulate", "--seeds", "x-y"], "seeds look like"),
        (["simulate", "--seeds", "42,5-1"], "seed range 5-1 runs backwards; write 1-5"),
        (["simulate", "--seeds", "42-"], "seeds look like"),
        (["simulate", "--seeds", "0-100000000"], "more than 1000 seeds"),
        (["simulate", "--seeds", "42,42"], "seed 42 given twice"),
        (["simulate", "--trace", "/no/such.csv"], "no such file"),
        (["simulate", "--mode", "time", "--load", "-1"], "loads must be positive"),
        (["simulate", "--mode", "time", "--load", "nan"], "loads must be positive numbers; got nan"),
        (["simulate", "--mode", "time", "--load", "0.9,inf"], "loads must be positive numbers; got 0.9,inf"),
        (["simulate", "--workers", "0"], "argument --workers: must be at least 1; got 0"),
        (["simulate", "--workers", "two"], "argument --workers: expected a whole number; got 'two'"),
        (["simulate", "--scheduler", "kube", "--weight", "-3"], "argument --weight: must be at least 1; got -3"),
        (["simulate", "--mode", "time", "--cluster-nodes", "0"], "argument --cluster-nodes: must be at least 1"),
        (["serve", "--threads", "0"], "argument --threads: must be at least 2; got 0"),
        (["serve", "--agent-interval", "-1"], "argument --agent-interval: must be at least 0; got -1"),
        (["serve", "--agent-interval", "nan"], "argument --agent-interval: must be at least 0; got nan"),
        (["serve", "--leader-elect", "--lease-duration", "0"], "argument --lease-duration: must be at least 1; got 0"),
    ],
)
def test_bad_arguments_are_refused_in_words(argv, words, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and words in capsys.readouterr().err


def test_a_malformed_trace_names_file_and_line(tmp_path, capsys, csvs):
    nodes, _ = csvs
    bad = tmp_path / "bad.csv"
    bad.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,100,1,1,500\np1,lots,1,1,500\n")
    code, _, err = run(capsys, "simulate", "--trace", str(bad), "--nodes", nodes, "--workers", "1", "--plot", "none")
    assert code == 2 and "bad.csv:3" in err and "cpu_milli" in err
    bad.write_text("name,cpu_milli\np0,1\n")
    code, _, err = run(capsys, "simulate", "--trace", str(bad), "--nodes", nodes, "--workers", "1", "--plot", "none")
    assert code == 2 and "missing columns" in err


def test_the_plot_is_written_by_default(csvs, capsys, tmp_path, monkeypatch):
    nodes, pods = csvs
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, "simulate", "--trace", pods, "--nodes", nodes, "--policy", "fgd", "--seeds", "1",
                       "--scheduler", "ideal", "--workers", "1")
    assert code == 0 and (tmp_path / "tessera-packing.png").read_bytes()[:4] == b"\x89PNG"
    assert "tessera-packing.png" in err


def test_nan_gpu_spec_is_no_constraint_and_models_no_node_has_are_reported_before_the_run(tmp_path, capsys):
    """pandas writes an empty gpu_spec as `nan`: it was read as a model, and those pods never fit, without a word."""
    from extender.sim.trace import load_pods

    nodes, pods = tmp_path / "nodes.csv", tmp_path / "openb_pod_list_spec.csv"
    nodes.write_text(NODES)
    pods.write_text(HEADER + "".join(
        f"p{i},1000,2048,1,500,{spec},LS,Running,0,600,0\n"
        for i, spec in enumerate(["nan", "NaN", "", "T4", "A100", "A100", "H100|A100", "nan|T4"])))
    models = [p.request.gpu_models for p in load_pods(pods)]
    assert models[:3] == [frozenset()] * 3 and models[7] == frozenset({"T4"})
    code, out, err = run(capsys, "simulate", "--trace", str(pods), "--nodes", str(nodes), "--policy", "tessera",
                         "--scheduler", "ideal", "--seeds", "1", "--json", "--plot", "none", "--workers", "1")
    assert code == 0
    warning = next(line for line in err.splitlines() if line.startswith("warning:"))
    assert "3 GPU pods ask only for models no node has" in warning and "A100 (2)" in warning and "A100|H100 (1)" in warning
    assert err.index("warning:") < len(err) and out  # said before the results, which still come


def test_json_does_not_overwrite_the_png_unless_asked(csvs, capsys, tmp_path, monkeypatch):
    nodes, pods = csvs
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tessera-packing.png").write_bytes(b"the table run's plot")
    code, out, _ = run(capsys, "simulate", "--trace", pods, "--nodes", nodes, "--policy", "fgd", "--scheduler", "ideal",
                       "--seeds", "1", "--json", "--workers", "1")
    assert code == 0 and out and (tmp_path / "tessera-packing.png").read_bytes() == b"the table run's plot"


@pytest.mark.parametrize("argv, words", [
    (["--cluster-nodes", "50"], "--cluster-nodes applies to --mode time only"),
    (["--plot", "/no/such/dir/p.png"], "no such directory: /no/such/dir"),
    (["--plot", "{tmp}"], "is a directory"),
    (["--plot", "{tmp}/plot.jpg"], "give a path ending in .png"),
    (["--reservations", "on"], "--reservations on is a time-mode setting"),
    (["--short-first", "on"], "--short-first on is a time-mode setting"),
    (["--short-first-run", "1h"], "--short-first-run is a time-mode setting"),
    (["--mode", "time", "--short-first", "off", "--short-first-waiting", "5"],
     "--short-first-waiting shapes shortest runs first, which --short-first off turns off"),
    (["--mode", "time", "--short-first", "on", "--short-first-run", "0s"], "--short-first-run must be 1 s to"),
    (["--mode", "time", "--short-first", "on", "--short-first-hold", "soon"], "--short-first-hold must be a duration"),
    (["--mode", "time", "--drain-pool", "8"], "add --reservations on"),
    (["--mode", "time", "--reservations", "on", "--drain-pool-run", "soon"], "--drain-pool-run"),
    (["--mode", "time", "--drain-keep", "4"], "add --reservations on"),
    (["--mode", "time", "--reservations", "on", "--drain-keep", "4", "--drain-pool", "8"],
     "--drain-pool and --drain-keep exclude each other"),  # a negative size: the parser's (tests/test_cli_audit.py)
    # flags that would have been taken and done nothing
    (["--load", "1.1"], "--load is a time-mode setting"),
    (["--queue", "events-only"], "--queue is a time-mode setting"),
    (["--declarations", "exact"], "--declarations is a time-mode setting"),
    (["--scheduler", "ideal", "--weight", "5"], "--weight shapes the kube scheduler's replay"),
    (["--scheduler", "ideal", "--extender-sees", "gpu"], "--extender-sees shapes the kube scheduler's replay"),
    (["--mode", "time", "--reservation-max-share", "0.3"], "--reservation-max-share shapes reservations, which are off"),
    (["--mode", "time", "--reservation-grace", "5m", "--drain-pool-run", "2h"],
     "--reservation-grace, --drain-pool-run shape reservations, which are off"),
    (["--mode", "time", "--reservations", "on", "--reservation-max-share", "2"], "--reservation-max-share is a share"),
    (["--mode", "time", "--reservations", "on", "--reservation-max-share", "nan"], "--reservation-max-share is a share"),
])
def test_simulate_refuses_flags_it_would_ignore_or_fail_on_late_before_running(csvs, capsys, tmp_path, monkeypatch, argv,
                                                                               words):
    import extender.sim.runner as runner

    monkeypatch.setattr(runner, "run_jobs", lambda *a: pytest.fail("ran before refusing"))
    nodes, pods = csvs
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    code, out, err = run(capsys, "simulate", "--trace", pods, "--nodes", nodes, *argv)
    assert code == 2 and words in err and out == ""


def test_progress_in_a_pipe_is_one_line_per_update_with_an_eta():
    import io

    from extender.cli.simulate import Progress

    now = [0.0]
    out = io.StringIO()
    p = Progress(4, out, clock=lambda: now[0])
    for n in range(1, 5):
        now[0] += 6.0  # a run every 6 s: a line at most every 10 s
        p.done(n)
    p.close()
    assert out.getvalue().splitlines() == ["2/4 runs done, ETA 12 s", "4/4 runs done in 24 s"]
    assert "\r" not in out.getvalue()


def test_packing_plot_each_policy_own_colour_and_dash_legend_outside_and_served_share_shown(csvs):
    """Before: colour only (tessera hid under fgd), the legend over the curves, and on unallocated alone
    k8s-default looked best (it hands a slice a whole GPU: allocated, but not serving demand)."""
    from extender.sim.plot import packing_figure, policy_styles
    from extender.sim.runner import Job, run_job

    nodes, pods = csvs
    policies = ("fgd", "tessera", "k8s-default")
    results = [run_job(Job(trace=pods, nodes=nodes, policy=p, scheduler="ideal", seed=1)) for p in policies]
    styles = policy_styles(policies)
    assert len({(s["color"], repr(s["linestyle"])) for s in styles.values()}) == 3
    assert len({s["color"] for s in styles.values()}) == 3 and len({repr(s["linestyle"]) for s in styles.values()}) == 3
    fig = packing_figure(results)
    top, bottom = fig.axes
    assert "not serving demand" in bottom.get_ylabel() and "unallocated" in top.get_ylabel()
    for ax in (top, bottom):
        assert {line.get_label(): line.get_color() for line in ax.lines} == {p: styles[p]["color"] for p in policies}
    at_100 = {(ax, line.get_label()): dict(zip(line.get_xdata(), line.get_ydata(), strict=True))[100]
              for ax in (top, bottom) for line in ax.lines}
    assert at_100[(bottom, "k8s-default")] > at_100[(top, "k8s-default")]  # the held-but-unused share shows
    fig.canvas.draw()
    legend = fig.legends[0].get_window_extent()
    assert legend.x0 >= max(ax.get_window_extent().x1 for ax in fig.axes)  # outside every panel


# -- heavy packages only where used: `tessera agent` on a node and `tessera simulate` on a laptop need
# neither the plotting stack (matplotlib, ~0.5 s and 40 MB) nor NVML's bindings nor the kubernetes client

HEAVY = ("matplotlib", "pynvml", "kubernetes")


def loaded_after(tmp_path, *argv: str) -> set[str]:
    """The HEAVY packages a fresh interpreter holds after `tessera ARGV` (no arguments: after importing the CLI)."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys, json\nimport extender.cli\nargv = json.loads(sys.argv[1])\n"
            "if argv:\n    try:\n        extender.cli.main(argv)\n    except SystemExit:\n        pass\n"
            f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})))")
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", code, json.dumps(argv)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin", "MPLBACKEND": "Agg"})
    assert done.returncode == 0, done.stderr
    return {m.split(".")[0] for m in json.loads(done.stdout.splitlines()[-1])}


@pytest.mark.parametrize("argv", [[], *([c, "--help"] for c in ("simulate", "serve", "inspect", "certs", "agent", "bridge"))])
def test_the_cli_and_its_help_import_no_heavy_package(tmp_path, argv):
    assert loaded_after(tmp_path, *argv) == set()


def test_a_simulation_imports_matplotlib_only_when_it_plots(csvs, tmp_path):
    nodes, pods = csvs
    run = ["simulate", "--trace", pods, "--nodes", nodes, "--policy", "fgd", "--scheduler", "ideal", "--seeds", "1",
           "--workers", "1"]
    assert loaded_after(tmp_path, *run, "--json") == set()
    assert loaded_after(tmp_path, *run, "--plot", str(tmp_path / "p.png")) == {"matplotlib"}  # the check sees it


# -- matplotlib is the `plot` extra (setup.cfg), not a requirement: the image ships without it, and there
# `tessera simulate` prints its tables and skips the PNG; a PNG asked for by name is refused before the run

NO_MATPLOTLIB = "matplotlib is not installed (pip install 'tessera[plot]', or --plot none)"


def simulate_without_matplotlib(tmp_path, *argv: str) -> tuple[int, str, str]:
    """`tessera simulate ARGV` in a fresh interpreter that cannot import matplotlib, run in tmp_path."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys, json\nsys.modules['matplotlib'] = None  # import matplotlib: ImportError, as if not installed\n"
            "from extender.cli import main\nsys.exit(main(['simulate', *json.loads(sys.argv[1])]))\n")
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", code, json.dumps(argv)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})
    return done.returncode, done.stdout, done.stderr


def test_without_matplotlib_the_default_plot_is_skipped_in_one_line_and_the_run_goes_on(csvs, tmp_path):
    nodes, pods = csvs
    code, out, err = simulate_without_matplotlib(tmp_path, "--trace", pods, "--nodes", nodes, "--policy", "fgd",
                                                 "--scheduler", "ideal", "--seeds", "1", "--workers", "1")
    assert code == 0, err
    assert f"no plot: {NO_MATPLOTLIB}" in err.splitlines() and "1 runs in" in out
    assert list(tmp_path.glob("*.png")) == [] and "plot:" not in err.replace("no plot:", "")


def test_without_matplotlib_a_plot_asked_for_is_refused_before_the_run(csvs, tmp_path):
    nodes, pods = csvs
    png = tmp_path / "p.png"
    code, out, err = simulate_without_matplotlib(tmp_path, "--trace", pods, "--nodes", nodes, "--policy", "fgd",
                                                 "--scheduler", "ideal", "--seeds", "1", "--workers", "1", "--plot", str(png))
    assert (code, out) == (2, "")
    assert err.splitlines() == [f"tessera: --plot {png}: {NO_MATPLOTLIB}"]  # no progress line: no replay started


@pytest.mark.parametrize("text, words", [
    ("garbage: [\n", "cannot use the kubeconfig: while parsing"),
    ("- a\n- b\n", "kubeconfig: not a kubeconfig (YAML without"),
    ("just a string\n", "kubeconfig: not a kubeconfig (YAML without"),
    ("clusters: 5\ncontexts: 5\ncurrent-context: x\n", "kubeconfig: not a kubeconfig (YAML without"),
    ("apiVersion: v1\nkind: Config\nclusters: []\n", "cannot use the kubeconfig: Invalid kube-config file"),
])
def test_a_broken_kubeconfig_is_one_line_not_a_traceback(tmp_path, text, words):
    """A kubeconfig that is not YAML, or YAML of another shape, died in a traceback from deep in the client library."""
    from extender.cli.serve import load_api

    path = tmp_path / "kubeconfig"
    path.write_text(text)
    with pytest.raises(ValueError) as e:
        load_api(str(path))
    assert words in str(e.value) and "\n" not in str(e.value)


def test_the_bridge_reads_its_flags_with_the_cli_s_own_rules(tmp_path, capsys):
    """`tessera bridge` takes serve's namespace rule and kubeconfig loader from the dispatcher (raybridge/cli.py imports
    nothing of the extender, and no copy of them exists to drift): a bad namespace and a bad kubeconfig are refused
    in serve's words."""
    from extender.cli import build_parser, main

    with pytest.raises(SystemExit):
        build_parser().parse_args(["bridge", "--namespace", "ML"])
    assert "'ML' is not a Kubernetes namespace name" in capsys.readouterr().err
    bad = tmp_path / "kubeconfig"
    bad.write_text("- a\n- b\n")
    assert main(["bridge", "--kubeconfig", str(bad)]) != 0
    assert "not a kubeconfig (YAML without the clusters, users and contexts of one)" in capsys.readouterr().err


def test_a_trace_that_asks_no_gpu_is_refused_and_pods_too_big_for_any_node_are_named(tmp_path, capsys, csvs, monkeypatch):
    """A CPU-only trace printed an empty table (packing) or 'load 0.8 is more than these pods can offer' (time); a pod
    asking more GPUs, CPU or memory than any node has was only a nan-filled table, without a word about why."""
    import extender.sim.runner as runner

    nodes, _ = csvs
    cpu_only = tmp_path / "cpu.csv"
    cpu_only.write_text(HEADER + "c0,1000,2048,0,0,,LS,Running,0,600,0\n")
    for mode in ("packing", "time"):
        monkeypatch.setattr(runner, "run_jobs", lambda *a: pytest.fail("ran a trace with nothing to measure"))
        code, out, err = run(capsys, "simulate", "--mode", mode, "--trace", str(cpu_only), "--nodes", nodes, "--plot", "none")
        assert code == 2 and "none of its 1 pods asks for a GPU" in err and out == ""
    monkeypatch.undo()
    big = tmp_path / "big.csv"
    big.write_text(PODS + "huge,1000,2048,16,1000,,LS,Running,0,600,0\n" + "fat,64000,2048,1,500,,LS,Running,0,600,0\n")
    code, out, err = run(capsys, "simulate", "--trace", str(big), "--nodes", nodes, "--policy", "tessera", "--scheduler",
                         "ideal", "--seeds", "1", "--workers", "1", "--plot", "none")
    assert code == 0 and out
    warning = next(line for line in err.splitlines() if "more than any node has" in line)
    assert "2 pods ask" in warning and "huge: 16 GPUs" in warning


HEAD = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time,deletion_time\n"


@pytest.mark.parametrize("rows, words", [
    ("p0,inf,1,1,500,0,10\n", "bad.csv:2: column 'cpu_milli' is not a whole number: 'inf'"),
    ("p0,1e400,1,1,500,0,10\n", "is not a whole number: '1e400'"),
    ("p0,100,1,0.5,500,0,10\n", "column 'num_gpu' is not a whole number: '0.5'"),  # was read as 0: a CPU-only pod
    ("p0,100,1,0,500,0,10\n", "gpu_milli 500 with num_gpu 0"),
    ("p0,100,1024\n", "bad.csv:2: 3 fields, the header has 7"),
    ("p0,100,1,1,500,0,10,extra\n", "bad.csv:2: 8 fields, the header has 7"),
    ("p0,100,1,1,500,0,10\np0,100,1,1,500,0,10\n", "bad.csv:3: pod 'p0' again (first at"),
    ("p0,100,1,1,500,50,10\n", "deletion_time 10 is before the pod started (50)"),
])
def test_a_trace_row_that_would_be_truncated_or_crash_is_refused_with_file_and_line(tmp_path, capsys, csvs, rows, words):
    nodes, _ = csvs
    bad = tmp_path / "bad.csv"
    bad.write_text(HEAD + rows)
    code, _, err = run(capsys, "simulate", "--trace", str(bad), "--nodes", nodes, "--workers", "1", "--plot", "none")
    assert code == 2 and words in err and "Traceback" not in err


def test_a_node_list_with_a_fractional_gpu_count_or_a_bom_or_latin1(tmp_path, capsys, csvs):
    _, pods = csvs
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,32000,131072,1.5,T4\n")
    code, _, err = run(capsys, "simulate", "--trace", pods, "--nodes", str(nodes), "--workers", "1", "--plot", "none")
    assert code == 2 and "column 'gpu' is not a whole number: '1.5'" in err  # was 1 GPU without a word
    bom = tmp_path / "bom.csv"  # a new name each time: the runner caches what it read by path
    bom.write_bytes(b"\xef\xbb\xbf" + NODES.encode())  # Excel's "CSV UTF-8"
    code, out, _ = run(capsys, "simulate", "--trace", pods, "--nodes", str(bom), "--policy", "fgd", "--scheduler",
                       "ideal", "--seeds", "1", "--workers", "1", "--plot", "none")
    assert code == 0 and "fgd" in out
    latin1 = tmp_path / "latin1.csv"
    latin1.write_bytes(NODES.replace("T4", "T\u00e9").encode("latin-1"))
    code, _, err = run(capsys, "simulate", "--trace", pods, "--nodes", str(latin1), "--workers", "1", "--plot", "none")
    assert code == 2 and "latin1.csv: not UTF-8 text" in err


def test_time_mode_refuses_a_trace_without_run_times_and_says_when_the_cluster_is_smaller(tmp_path, capsys, csvs):
    nodes, pods = csvs
    untimed = tmp_path / "untimed.csv"
    untimed.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,100,1,1,500\np1,100,1,1,1000\n")
    code, _, err = run(capsys, "simulate", "--mode", "time", "--trace", str(untimed), "--nodes", nodes, "--workers", "1",
                       "--plot", "none")
    assert code == 2 and "2 of its 2 pods have no deletion_time" in err  # before: every pod ran 1 s, waits 0
    code, _, err = run(capsys, "simulate", "--mode", "time", "--trace", pods, "--nodes", nodes, "--policy", "fgd",
                       "--scheduler", "ideal", "--seeds", "1", "--load", "0.5", "--workers", "1", "--plot", "none")
    assert code == 0 and "time mode samples 100 nodes and the node list has 40: replaying on all 40" in err
    code, _, err = run(capsys, "simulate", "--mode", "time", "--trace", pods, "--nodes", nodes, "--reservations", "on",
                       "--drain-pool", "40", "--seeds", "1", "--workers", "1", "--plot", "none")
    assert code == 2 and "--drain-pool 40 keeps every one of the 40 nodes" in err


@pytest.mark.parametrize("argv, words", [
    (["serve", "--leader-elect", "--lease-duration", "1.9"], "argument --lease-duration: expected a whole number"),
    (["serve", "--leader-elect", "--lease-duration", "1e308"], "argument --lease-duration: expected a whole number"),
    (["serve", "--leader-elect", "--lease-duration", "7200"], "argument --lease-duration: must be at most 3600"),
    (["inspect", "--pod", "ml/a", "--node", "x"], "not allowed with argument --pod"),
    (["inspect", "--full", "--node", "x"], "not allowed with argument --full"),
    (["inspect", "--pod", "noslash"], "a pod is namespace/name"),
    (["inspect", "--pod", ""], "a pod is namespace/name"),
    (["inspect", "--node", " "], "argument --node: must not be empty"),
])
def test_flags_that_were_truncated_or_silently_overruled_are_refused(argv, words, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and words in capsys.readouterr().err


@pytest.mark.parametrize("argv, words", [
    (["serve", "--move-interval", "1m"], "--move-interval applies with --moves on only"),
    (["serve", "--lease-name", "x"], "--lease-name applies with --leader-elect only"),
    (["serve", "--lease-duration", "20"], "--lease-duration applies with --leader-elect only"),
    (["serve", "--advertise-url", "http://x"], "--advertise-url applies with --leader-elect only"),
    (["serve", "--prefix", "tessera"], "--prefix is a URL path like /tessera"),
    (["serve", "--prefix", "/tessera/"], "--prefix is a URL path like /tessera"),
    (["inspect", "--per-node"], "--per-node shows one pod's reason on each node: give --pod"),
])
def test_serve_inspect_and_certs_refuse_before_connecting(argv, words, capsys, tmp_path):
    argv = [str(tmp_path / "c") if a == "OUT" else a for a in argv]
    code, _, err = run(capsys, *argv)
    assert code == 2 and words in err
    assert not (tmp_path / "c").exists()


def test_serve_names_a_tls_file_that_is_not_pem_before_connecting(tmp_path, capsys):
    kubeconfig = tmp_path / "kc.yaml"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    code, _, err = run(capsys, "serve", "--kubeconfig", str(kubeconfig), "--tls-cert", str(kubeconfig), "--tls-key",
                       str(kubeconfig))
    assert code == 2 and f"--tls-cert {kubeconfig}: not a PEM certificate" in err


def test_two_traces_under_one_label_are_refused_not_merged(tmp_path, capsys, csvs):
    nodes, pods = csvs
    other = tmp_path / "b"
    other.mkdir()
    (other / "openb_pod_list_tiny.csv").write_text(PODS)
    for second in (str(other / "openb_pod_list_tiny.csv"), pods):  # the same name elsewhere, or the same file twice
        code, _, err = run(capsys, "simulate", "--trace", pods, "--trace", second, "--nodes", nodes, "--workers", "1",
                           "--plot", "none")
        assert code == 2 and "would both be reported as trace 'tiny'" in err
