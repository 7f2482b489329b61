"""The benchmark scripts' measuring functions still run on this tree, for a tiny budget,
and the dashboard (benchmarks/README.md) has a row for each of them.

Nothing here judges a time: the numbers are printed by the scripts and kept on the
dashboard. These tests catch a script that no longer runs, a benchmark without a row,
and a local absolute path in a script or doc.
"""

from __future__ import annotations

import csv
import importlib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def script(name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    # On sys.path, so that processes started with "spawn" can import it too.
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module(name)


def test_layer_overhead_splits_a_step_into_env_and_layer_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    layer_overhead = script("layer_overhead", monkeypatch)
    for copy in (False, True):
        times = layer_overhead.measure_layer("corral/rps", 4, copy, 0.05)
        assert 0 < times["env"] < times["timed_total"]
        assert times["layer"] == pytest.approx(times["total"] - times["env"])


def test_the_timing_proxy_passes_for_the_env_it_times(monkeypatch: pytest.MonkeyPatch) -> None:
    import corral

    layer_overhead = script("layer_overhead", monkeypatch)
    clock = layer_overhead.Clock()
    env = corral.make("corral/rps")
    timed = layer_overhead.timed_env_class()(env, clock)
    assert corral.adapt(timed) is timed
    timed.check_actions = False  # what the vector layer does to a corral env
    assert env.check_actions is False
    assert timed.possible_agents == env.possible_agents
    assert timed.state_space == env.state_space
    timed.reset(seed=0)
    assert clock.seconds > 0
    assert timed.agents == env.agents


def test_the_ceiling_runs_two_processes_together(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("mpe2")
    vector_throughput = script("vector_throughput", monkeypatch)
    assert vector_throughput.bench_ceiling(2, 0.05) > 0


def test_the_tree_comparison_times_each_tree_in_its_own_process(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("mpe2")
    vector_throughput = script("vector_throughput", monkeypatch)
    src = str(BENCHMARKS.parent / "src")
    # a tree without corral: not measured (whether corral is installed elsewhere or not)
    with pytest.raises(RuntimeError, match=r"imported corral from|failed"):
        vector_throughput.run_tree(str(BENCHMARKS), ["sync"], [1], 0.01)
    trees = {"before": src, "after": src}
    vector_throughput.compare_trees(trees, ["sync"], [1, 2], 0.02, rounds=1)
    rows = re.findall(r"^(raw loop|sync) +(\d+) +[\d,]+ +[\d,]+ +[\d.]+  \(rounds: [\d.]+\)$",
                      capsys.readouterr().out, re.MULTILINE)  # fmt: skip
    assert rows == [("raw loop", "1"), ("sync", "1"), ("sync", "2")]


def batched_mpe(*args: str) -> tuple[str, dict[tuple[int, str], tuple[float, str, int]]]:
    """The output of batched_mpe.py at E=1 and 8 for a few hundredths of a second per cell,
    and its table: (E, implementation) -> (env-steps/s, ratio to mpe2's loop, obs/env)."""
    command = [sys.executable, str(BENCHMARKS / "batched_mpe.py"), "--envs", "1", "8"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [*command, "--seconds", "0.02", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    row = re.compile(r"^\s*(\d+)  (\S.*?)\s{2,}([\d,]+)\s+(\S+)\s+(\d+)$")
    table = {}
    for line in done.stdout.splitlines():
        if match := row.match(line):
            e, name, rate, ratio, obs = match.groups()
            table[int(e), name] = (float(rate.replace(",", "")), ratio, int(obs))
    return done.stdout, table


def test_batched_mpe_times_mpe2_and_corral_side_by_side() -> None:
    pytest.importorskip("mpe2")
    out, table = batched_mpe("--peers", "--no-compile")
    dict_path = "corral dict (native=False)"
    assert {(1, "mpe2 loop"), (1, dict_path), (8, dict_path)} <= set(table)
    assert (8, "mpe2 loop") not in table  # one env: its rate is the reference
    assert table[1, "mpe2 loop"][1] == "1.0x"
    for rate, _, obs in table.values():
        assert rate > 0
        assert obs == 3 * 18  # simple_spread N=3: 18 floats per agent
    native = {name for _, name in table if name.startswith("corral native")}
    assert ("corral native MPE: not available" in out) != bool(native), out
    assert "corral native numpy float64" in native and not any("compiled" in n for n in native)
    assert "VMAS" not in out and "JaxMARL" not in out  # --peers alone: none


def test_many_agents_times_the_raw_loop_and_both_backends_side_by_side(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("magent2")
    many_agents = script("many_agents", monkeypatch)
    many_agents.main(["--rounds", "1", "--seconds", "0.05", "--map-size", "16"])
    out = capsys.readouterr().out
    rows = re.findall(r"^(raw loop|sync|subproc) +(\d+) +([\d,]+) +([\d,]+) +([\d.]+)$",
                      out, re.MULTILINE)  # fmt: skip
    assert [(loop, envs) for loop, envs, *_ in rows] == [
        ("raw loop", "1"), ("sync", "2"), ("subproc", "2")
    ]  # fmt: skip
    for _, _, env_rate, agent_rate, _ in rows:
        env_steps, agent_steps = (float(r.replace(",", "")) for r in (env_rate, agent_rate))
        # map 16: 12 agents per env (the printed rates are rounded)
        assert 0 < env_steps < agent_steps <= 12 * (env_steps + 1)
    assert rows[0][4] == "1.00"


@pytest.mark.slow
def test_batched_mpe_times_the_installed_peers() -> None:
    pytest.importorskip("mpe2")
    installed = {m for m in ("vmas", "jaxmarl") if importlib.util.find_spec(m) is not None}
    if not installed:
        pytest.skip("neither VMAS nor JaxMARL is installed")
    out, table = batched_mpe("--no-compile")
    names = {"vmas": ["VMAS"], "jaxmarl": ["JaxMARL scan", "JaxMARL loop"]}
    for module, peer_names in names.items():
        for name in peer_names:
            assert ((1, name) in table and (8, name) in table) == (module in installed), out
        if module not in installed:
            assert f"not installed (pip install {module})" in out
    assert out.count("corral best / best peer:") == 2


def test_the_wall_clock_benchmark_times_each_evaluation_from_process_start(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pytest.importorskip("mpe2")
    pytest.importorskip("torch")
    learn_wallclock = script("learn_wallclock", monkeypatch)
    args = learn_wallclock.argparse.Namespace(
        algo="mappo",
        out=tmp_path,
        total_steps=1600,
        seconds=600,
        eval_every=800,
        eval_episodes=2,
        set=["num_envs=4", "rollout_steps=5", "env_kwargs.N=2"],
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(BENCHMARKS.parent / "src"), *sys.path]))
    evaluations = learn_wallclock.train(args, seed=0)
    assert [steps for steps, _, _ in evaluations] == [0, 800, 1600]
    seconds = [t for _, t, _ in evaluations]
    assert 0 < seconds[0] < seconds[1] < seconds[2]
    from corral.training.metrics import read_metrics

    exact = [r["eval_return"] for r in read_metrics(tmp_path / "s0") if "eval_return" in r]
    assert [value for _, _, value in evaluations] == exact


def test_the_wall_clock_benchmark_runs_a_config_file_per_seed_and_writes_the_curve(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("mpe2")
    pytest.importorskip("torch")
    pytest.importorskip("matplotlib")
    learn_wallclock = script("learn_wallclock", monkeypatch)
    config = tmp_path / "tiny.yaml"
    config.write_text(
        "algo: ippo\ntarget: -1000\nnum_envs: 4\nrollout_steps: 5\nhidden: [16]\n"
        "env_kwargs: {N: 2}\n"
    )
    assert learn_wallclock.config_settings(config) == (
        {"algo": "ippo", "target": -1000},
        ["num_envs=4", "rollout_steps=5", "hidden=[16]", "env_kwargs.N=2"],
    )
    packaged = learn_wallclock.config_settings(BENCHMARKS / "spread_10min.yaml")
    assert packaged[0] == {"algo": "mappo", "target": -10.5}
    monkeypatch.setattr(learn_wallclock, "reference_scores", lambda *a, **k: {})
    commands = []

    def train(args, seed):  # two seeds' evaluations, without their processes
        commands.append(learn_wallclock.command(args, seed))
        return [(0, 2.0 + seed, -50.0 + seed), (400, 3.0 + seed, -20.0), (800, 5.0, -9.0 - seed)]

    monkeypatch.setattr(learn_wallclock, "train", train)
    out = tmp_path / "out"
    argv = ["learn_wallclock.py", "--config", str(config), "--seeds", "0", "1", "--out", str(out)]
    argv += ["--set", "lr=0.002", "--target", "-9.5"]
    monkeypatch.setattr(sys, "argv", argv)
    learn_wallclock.main()
    settings = ["num_envs=4", "rollout_steps=5", "hidden=[16]", "env_kwargs.N=2", "lr=0.002"]
    for seed, line in enumerate(commands):
        assert line[line.index("train") + 1] == "ippo"
        assert line[line.index("--seed") + 1] == str(seed)
        assert line[-5:] == settings
    printed = capsys.readouterr().out
    assert "the mean over seeds reaches -9.5 at 800 env steps, 5.0 s" in printed
    with open(out / "curve.csv") as file:
        rows = list(csv.DictReader(file))
    assert [(r["seed"], int(r["env_steps"])) for r in rows] == [
        (seed, steps) for seed in ("0", "1", "mean") for steps in (0, 400, 800)
    ]
    for i, mean in enumerate(rows[6:]):
        values = [float(rows[k]["eval_return"]) for k in (i, i + 3)]
        assert float(mean["eval_return"]) == pytest.approx(sum(values) / 2)
        assert float(mean["seconds"]) == max(float(rows[k]["seconds"]) for k in (i, i + 3))


def test_the_learner_benchmark_times_the_runner_and_splits_a_rollout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("mpe2")
    pytest.importorskip("torch")
    learner_throughput = script("learner_throughput", monkeypatch)
    import corral.algos.mappo as mappo

    act = mappo.MAPPOPolicy.act
    rollout = learner_throughput.ROLLOUT
    result = learner_throughput.corral_round(3 * rollout, profile=True)
    assert result["rate"] > 0
    assert result["rollouts"] == 3
    ms = learner_throughput.breakdown(result)
    parts = [name for name in ms if name != "total"]
    assert parts == [*learner_throughput.SECTIONS, "Python between"]
    assert all(ms[name] > 0 for name in parts if name != "Python between"), str(ms)
    # the rest of the loop: small, and within the wrappers' own timing noise of positive
    # (a part counted twice would take more than that)
    assert ms["Python between"] > -0.02 * ms["total"], str(ms)
    assert sum(ms[name] for name in parts) == pytest.approx(ms["total"])
    assert mappo.MAPPOPolicy.act is act  # the wrapped functions are the tree's own again


def test_the_learner_benchmark_refuses_a_jaxmarl_path_without_the_baseline(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    learner_throughput = script("learner_throughput", monkeypatch)
    with pytest.raises(SystemExit, match=r"no baselines/IPPO/ippo_ff_mpe\.py"):
        learner_throughput.jaxmarl_round(str(tmp_path), sys.executable, 3 * 2048)


ROOT = BENCHMARKS.parent
HELPERS = {"source_trees.py"}
"""Scripts of benchmarks/ that are shared code, not benchmarks (no dashboard row)."""
LOCAL_PATH = re.compile(r"(?<![\w.$}/-])/(?:work|home|tmp)/")


def pages_and_scripts() -> list[Path]:
    """The benchmark scripts and their recorded logs, and every doc and source file that
    could name a path."""
    found = [*BENCHMARKS.glob("*.py"), *BENCHMARKS.glob("*.sh"), *BENCHMARKS.glob("*.md")]
    found += [*(BENCHMARKS / "results").rglob("*.log")]
    found += [*(ROOT / "docs").glob("*.md"), ROOT / "README.md", ROOT / "Makefile"]
    found += [*(ROOT / "src").rglob("*.py"), *(ROOT / "src").rglob("*.yaml")]
    return found


def test_no_script_or_doc_holds_a_local_absolute_path() -> None:
    files = pages_and_scripts()
    assert BENCHMARKS / "layer_overhead.py" in files and ROOT / "docs/training.md" in files
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in files
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if LOCAL_PATH.search(line)
    ]
    assert found == []


def test_the_local_path_pattern_finds_absolute_paths_only() -> None:
    assert LOCAL_PATH.search('DEFAULT_BEFORE = "/work/wt/baseline/src"')
    assert LOCAL_PATH.search("PYTHONPATH=/home/me/corral/src python x.py")
    assert LOCAL_PATH.search("--out /tmp/wallclock")
    assert not LOCAL_PATH.search("--out runs/tmp/x, $TMPDIR/work/, ../before/src")


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {github_anchor(h) for h in re.findall(r"^#+ (.*)$", page.read_text(), re.MULTILINE)}


def test_the_dashboard_is_one_page_with_a_row_per_benchmark() -> None:
    readme = BENCHMARKS / "README.md"
    page = readme.read_text()
    assert len(page.splitlines()) < 300
    scripts = {p.name for p in BENCHMARKS.glob("*.py")}
    assert scripts >= HELPERS
    rows = set(re.findall(r"^\| \[`(\w+\.(?:py|sh))\b", page, re.MULTILINE))
    assert scripts - HELPERS <= rows, f"no dashboard row: {sorted(scripts - HELPERS - rows)}"
    # every link into the dashboard or the journal lands on a heading
    targets = {"": anchors(readme), "JOURNAL.md": anchors(BENCHMARKS / "JOURNAL.md")}
    links = re.findall(r"\]\((JOURNAL\.md|)#([\w-]+)\)", page)
    assert len(links) >= 10
    for page_name, anchor in links:
        assert anchor in targets[page_name], f"{page_name}#{anchor}"


def test_a_script_without_a_before_tree_measures_the_current_tree_alone(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    source_trees = script("source_trees", monkeypatch)
    import argparse

    parser = argparse.ArgumentParser()
    source_trees.add_tree_options(parser)
    src = str(ROOT / "src")
    assert source_trees.chosen_trees(parser, parser.parse_args([])) == {"after": src}
    both = parser.parse_args(["--before-src", src])
    assert list(source_trees.chosen_trees(parser, both)) == ["before", "after"]
    with pytest.raises(SystemExit):
        source_trees.chosen_trees(parser, parser.parse_args(["--before-src", str(BENCHMARKS)]))
    assert "--before-src" in capsys.readouterr().err


def test_ab_steps_prints_each_paths_fastest_step_in_both_trees() -> None:
    src = str(BENCHMARKS.parent / "src")
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "ab_steps.py"), "--before-src", src, "--after-src",
         src, "--rounds", "1", "--seconds", "0.05", "--block", "2",
         "--paths", "rps dict copy=False", "climbing native"],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = re.findall(r"^(rps dict copy=False|climbing native) +([\d,.]+) +([\d,.]+)  ([\d.]+)$",
                      done.stdout, re.MULTILINE)  # fmt: skip
    assert [row[0] for row in rows] == ["rps dict copy=False", "climbing native"]
    assert all(float(before.replace(",", "")) > 0 for _, before, _, _ in rows)


def test_ray_scaling_times_one_process_and_the_workers_side_by_side(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("mpe2")
    pytest.importorskip("torch")
    pytest.importorskip("ray")
    ray_scaling = script("ray_scaling", monkeypatch)
    ray_scaling.main(["--runners", "1", "--envs-per-runner", "2", "--updates", "1", "--rounds=1"])
    out = capsys.readouterr().out
    number = r"([\d,.]+|-)"
    rows = re.findall(rf"^(1 process|1 worker) +(\d+) +{' +'.join([number] * 11)}$",
                      out, re.MULTILINE)  # fmt: skip
    assert [(path, envs) for path, envs, *_ in rows] == [("1 process", "2"), ("1 worker", "2")]
    single, worker = ({k: v for k, v in zip(HEADS, row[2:], strict=True)} for row in rows)
    assert float(single["rate"].replace(",", "")) > 0 and single["x single"] == "1.00"
    assert worker["x one"] == "1.00" and worker["ceiling"] == "1.00"
    assert single["wait"] == single["rollout"] == "-"
    assert 0 < float(worker["wait"]) < 1 and float(worker["rollout"]) > 0
    assert float(worker["sample"]) > 0 and float(worker["learn"]) > 0
    assert re.search(r"^weights update: \d+ KB per put$", out, re.MULTILINE)


HEADS = ("rate", "x one", "x single", "sample", "transfer", "join", "learn", "wait", "learned",
         "ceiling", "rollout")  # fmt: skip
"""The columns of ray_scaling.py's table after the path and its envs."""
