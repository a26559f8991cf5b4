"""A new user's audit of the command lines: each mistake is refused in one line that names the flag or file at fault."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from extender.cli import main

ROOT = Path(__file__).resolve().parents[1]


def refused(capsys, *argv: str) -> str:
    """argparse's refusal: exit 2, nothing on stdout, the last line of stderr."""
    with pytest.raises(SystemExit) as e:
        main(list(argv))
    out = capsys.readouterr()
    assert e.value.code == 2 and out.out == ""
    return out.err.strip().splitlines()[-1]


@pytest.mark.parametrize("flag, value, words", [
    ("--policy", "fgd,fgd", "policy fgd given twice"),
    ("--policy", "fgd,tessera,fgd", "policy fgd given twice"),
    ("--scheduler", "ideal,ideal", "scheduler ideal given twice"),
    ("--load", "0.9,0.9", "load 0.9 given twice"),
    ("--load", "0.9,0.90", "load 0.9 given twice"),
])
def test_a_repeated_name_or_load_is_refused_not_run_as_extra_seeds(capsys, flag, value, words):
    err = refused(capsys, "simulate", "--mode", "time", flag, value, "--seeds", "42", "--plot", "none")
    assert flag in err and words in err


def python(code: str, *args: str, cwd: Path = ROOT, path: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **({"PATH": path} if path is not None else {})}
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env=env)


def test_train_without_the_ray_extra_says_so_in_one_line():
    code = ("import sys\nsys.modules['ray'] = None  # as if the ray extra were not installed\n"
            "from raybridge.job import main\nsys.exit(main(sys.argv[1:]))")
    done = python(code, "train", "--address", "127.0.0.1:1", "--entrypoint", "raybridge.workload:Workload", "--world", "2")
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert done.stderr.strip().splitlines() == [
        "raybridge.job: train needs the ray extra (pip install -e '.[ray]'): ray is not installed"]


NO_PYTEST = "import runpy, sys\nsys.modules['pytest'] = None  # as if the test extra were not installed\n" \
            "sys.argv = sys.argv[1:]\nrunpy.run_path(sys.argv[0], run_name='__main__')"


def test_page_load_needs_no_test_extra_and_a_run_without_chromium_says_so(tmp_path):
    """Its synthetic cluster came from a test module that imports pytest, so it needed the test extra; it is
    testing/'s now, which needs only the packages' own dependencies."""
    done = python(NO_PYTEST, "bench/page_load.py", "--help")
    assert done.returncode == 0 and "--nodes" in done.stdout, done.stderr
    done = python(NO_PYTEST, "bench/page_load.py", "--nodes", "1", "--runs", "1", path=str(tmp_path))  # no chromium
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == ["chromium is not installed (scripts/chromium.sh)"]


def test_ctrl_c_during_a_simulation_is_one_line_and_exit_130_from_parent_and_workers(tmp_path):
    import signal
    import time

    proc = subprocess.Popen([sys.executable, "-m", "extender.cli", "simulate", "--plot", "none", "--workers", "2"],
                            cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # a shell's job ignores it
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    deadline = time.monotonic() + 60
    while len(children.read_text().split()) < 2 and time.monotonic() < deadline:  # the pool's workers are running
        time.sleep(0.05)
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and out == ""
    assert err.strip().splitlines() == ["tessera: interrupted"]


def tessera(*argv: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "extender.cli", *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def one_line(done: subprocess.CompletedProcess, code: int = 2) -> str:
    assert done.returncode == code and done.stdout == "", done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_certs_out_that_is_a_file_and_a_bad_ip_name_their_flags(tmp_path):
    (tmp_path / "f").write_text("x")
    assert one_line(tessera("certs", "--out", "f", cwd=tmp_path)) == "tessera: --out f is a file; give a directory"
    assert one_line(tessera("certs", "--out", "f/sub", cwd=tmp_path)).startswith("tessera: --out f/sub: cannot make")
    assert one_line(tessera("certs", "--out", "new", "--ip", "999.1.1.1", cwd=tmp_path)).startswith(
        "tessera: --ip: '999.1.1.1' does not appear to be an IP")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]  # nothing written


def test_a_binary_kubeconfig_is_named_not_a_codec_error(tmp_path):
    (tmp_path / "kc").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x8c\xff" * 20)
    assert one_line(tessera("serve", "--kubeconfig", "kc", cwd=tmp_path)) == \
        "tessera: --kubeconfig kc: not a kubeconfig (not UTF-8 text)"
    env = {"KUBECONFIG": "kc", "KUBERNETES_SERVICE_HOST": ""}
    assert one_line(tessera("serve", cwd=tmp_path, env=env)) == "tessera: KUBECONFIG=kc: not a kubeconfig (not UTF-8 text)"


@pytest.mark.parametrize("flag", ["--trace", "--nodes"])
def test_a_directory_or_an_empty_csv_is_said_as_such(capsys, tmp_path, flag):
    (tmp_path / "empty.csv").write_text("")
    (tmp_path / "blank.csv").write_text("\n  \n")
    assert refused(capsys, "simulate", flag, str(tmp_path)).endswith(f"{flag}: {tmp_path} is a directory, not a file")
    for name in ("empty.csv", "blank.csv"):
        assert refused(capsys, "simulate", flag, str(tmp_path / name)).endswith(
            f"{flag}: {tmp_path / name} is empty (a CSV starts with its header row)")


def test_openb_bench_says_an_empty_csv_is_empty(tmp_path):
    from extender.cli.simulate import check_packable

    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(ValueError, match=r"empty.csv is empty \(a CSV starts with its header row\)$"):
        check_packable(str(tmp_path / "empty.csv"), "embedded")


@pytest.mark.parametrize("command", [["simulate", "--mode", "time", "--plot", "none"], ["serve"]])
def test_drain_flags_are_named_when_negative_or_given_together(capsys, command):
    for flag in ("--drain-pool", "--drain-keep"):
        assert refused(capsys, *command, "--reservations", "on", flag, "-1").endswith(
            f"argument {flag}: must be at least 0; got -1")
    assert main([*command, "--reservations", "on", "--drain-pool", "3", "--drain-keep", "2"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.strip().splitlines() == [
        "tessera: --drain-pool and --drain-keep exclude each other (a fixed drain pool or a floating one): choose one"]


@pytest.mark.parametrize("script", ["bench/body_size.py", "tools/derive_openb_stats.py"])
def test_bench_and_tool_help_exits_0_and_a_bad_option_exits_2_without_running(script, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(ROOT / script), "--help"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 0 and done.stdout.startswith(f"usage: python {script}") and done.stderr == ""
    done = subprocess.run([sys.executable, str(ROOT / script), "--bogus"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 2 and done.stdout == "" and "unrecognized arguments: --bogus" in done.stderr


def test_load_bench_says_when_memory_drift_cannot_be_measured_never_nan():
    from bench.load import memory_drift

    short = memory_drift([(t, 85.0 + t / 10, 200 + 100 * t, 400) for t in range(6)])
    flat = memory_drift([(t, 85.0, 500, 400) for t in range(30)])
    grew = memory_drift([(t, 85.0 + (t >= 10), 100 + 200 * (t >= 10), 400) for t in range(30)])
    assert short == ("RSS and memo drift: not measured, the run's 5 s of samples hold no separate first and last 10 s "
                     "(--seconds 20 or more)")
    assert flat == "RSS +0.0 MiB (+0.0%) while the fragmentation memo did not grow (500 entries): no bytes per entry"
    assert grew.endswith("while the fragmentation memo grew by 200 entries: 5243 bytes per entry")


@pytest.mark.parametrize("argv, usage, extra", [
    (["simulate", "--polcy", "fgd"], "usage: tessera simulate ", "--polcy fgd"),
    (["certs", "--out", "x", "--dsn", "a"], "usage: tessera certs ", "--dsn a"),
    (["inspect", "stray"], "usage: tessera inspect ", "stray"),
    (["--bogus", "inspect"], "usage: tessera [-h] [--version]\n", "--bogus"),  # before the command: the top level's
])
def test_an_unknown_option_shows_its_commands_usage(capsys, argv, usage, extra):
    with pytest.raises(SystemExit) as e:
        main(argv)
    out = capsys.readouterr()
    assert e.value.code == 2 and out.out == "" and out.err.startswith(usage)
    assert out.err.strip().splitlines()[-1].endswith(f"error: unrecognized arguments: {extra}")


def test_every_reader_of_a_trace_says_an_empty_csv_is_empty_and_the_bench_a_directory(tmp_path):
    import subprocess
    import sys

    from extender.sim.trace import TraceError, load_nodes, load_pods

    (tmp_path / "empty.csv").write_text("")
    for load in (load_pods, load_nodes):
        with pytest.raises(TraceError, match=r"empty.csv is empty \(a CSV starts with its header row\)$"):
            load(tmp_path / "empty.csv")
    bench = Path(__file__).resolve().parents[1] / "bench" / "openb.py"
    done = subprocess.run([sys.executable, str(bench), str(tmp_path)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2 and done.stderr.strip().endswith(f"{tmp_path} is a directory, not a CSV file")


def test_a_kubeconfig_or_tls_path_that_is_a_directory_or_other_yaml_is_said_as_such(tmp_path):
    """'no such file: /tmp' for a directory that was there, and 'TypeError: str object does not support item
    assignment' for a CSV passed as the kubeconfig (new-user audit, 2026-12-02)."""
    (tmp_path / "d").mkdir()
    (tmp_path / "pods.csv").write_text("a,b\n1,2\n")
    assert one_line(tessera("serve", "--kubeconfig", "d", cwd=tmp_path)) == "tessera: --kubeconfig: d is a directory, not a file"
    assert one_line(tessera("serve", "--kubeconfig", "pods.csv", cwd=tmp_path)) == \
        "tessera: --kubeconfig pods.csv: not a kubeconfig (YAML without the clusters, users and contexts of one)"
    assert one_line(tessera("serve", "--tls-cert", "d", "--tls-key", "d", cwd=tmp_path)) == \
        "tessera: --tls-cert: d is a directory, not a file"


@pytest.mark.parametrize("argv, words", [
    (("serve", "--lease-namespace", "Bad NS"), "argument --lease-namespace: 'Bad NS' is not a Kubernetes namespace name"),
    (("bridge", "--namespace", "BAD"), "argument --namespace: 'BAD' is not a Kubernetes namespace name"),
    (("certs", "--out", "x", "--namespace", "a_b"), "argument --namespace: 'a_b' is not a Kubernetes namespace name"),
    (("serve", "--threads", "1"), "argument --threads: must be at least 2; got 1"),
])
def test_a_bad_namespace_or_a_single_thread_is_refused_by_the_parser(capsys, argv, words):
    """A bad namespace was retried against the API for ever; --threads 1 was refused as '--max-gang-waits 1 must be
    at least 1 and below --threads 1', a flag the user never passed."""
    assert words in refused(capsys, *argv)


def test_key_and_inventory_files_that_cannot_be_read_name_their_flag(tmp_path):
    from extender.serve import load_signer
    from gpu_sharing.devices import BackendUnavailable
    from gpu_sharing.static import StaticBackend
    from raybridge.bridge import load_key

    (tmp_path / "empty.key").write_bytes(b"")
    (tmp_path / "blob").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x8c\xff")
    for path, words in ((tmp_path, "is a directory"), (tmp_path / "none", "no such file or directory")):
        with pytest.raises(ValueError, match=f"^--key-file {path}: {words}$"):
            load_key(str(path), None)
    with pytest.raises(ValueError, match=r"^--assignment-key-file .*empty.key: the assignment key must be at least 16 bytes; "
                                         r"entry 'key' has 0$"):
        load_signer(str(tmp_path / "empty.key"))
    with pytest.raises(ValueError, match=r"^--assignment-key-file .*none: No such file or directory$"):
        load_signer(str(tmp_path / "none"))
    with pytest.raises(BackendUnavailable, match="inventory file .*: Is a directory"):
        StaticBackend(tmp_path)
    with pytest.raises(BackendUnavailable, match=r"inventory file .*blob: not UTF-8 text \(the inventory is JSON or YAML\)"):
        StaticBackend(tmp_path / "blob")


def test_a_plot_path_that_cannot_be_written_is_refused_before_the_run_even_for_root(capsys):
    """os.access says yes to root everywhere: /sys/x.png was found out after the whole run, as a bare errno."""
    assert main(["simulate", "--policy", "fgd", "--scheduler", "ideal", "--seeds", "42", "--plot", "/proc/x.png"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.startswith("tessera: --plot /proc/x.png: cannot write there")  # no table: nothing ran


def test_version_is_the_installed_distributions(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"tessera {version('tessera')}"
