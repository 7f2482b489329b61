"""The registry: register, make, namespaces, helpful errors, lazy optional imports."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import uuid
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from support.plugins import installed_package, plugin_module

import corral
from corral import registry
from corral.env import MultiAgentEnv
from corral.envs.rps import RockPaperScissors
from corral.errors import MissingDependencyError, RegistrationError, UnknownEnvError
from corral.registry import make, namespaces, register, register_namespace, registered_ids, spec

pytestmark = pytest.mark.usefixtures("isolated_registry")

OPTIONAL_PACKAGES = ("pettingzoo", "pyspiel", "mpe2", "ray", "torch")


class Recorder(MultiAgentEnv):
    """An env that remembers the arguments it was built with."""

    possible_agents = ["a_0"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.kwargs = kwargs


def needs_missing_package(**kwargs: Any) -> Any:
    raise ModuleNotFoundError("No module named 'fancy_sim'", name="fancy_sim")


def test_register_a_callable_with_defaults_merged_into_kwargs() -> None:
    register("test/recorder", Recorder, size=3, mode="fast")
    env = make("test/recorder", mode="slow", extra=1)
    assert isinstance(env, Recorder)
    assert env.kwargs == {"size": 3, "mode": "slow", "extra": 1}
    assert "test/recorder" in registered_ids()
    assert registered_ids("test") == ["test/recorder"]
    assert spec("test/recorder").kwargs == {"size": 3, "mode": "fast"}


def test_register_a_module_attr_string_resolves_only_at_make() -> None:
    register("test/base", "corral.env:MultiAgentEnv")
    register("test/lazy", "no_such_module_anywhere:Env")  # not imported yet: no error
    assert type(make("test/base")) is MultiAgentEnv
    with pytest.raises(ModuleNotFoundError):
        make("test/lazy")


def test_resolve_follows_dotted_attributes() -> None:
    assert registry.resolve("corral.env:MultiAgentEnv.reset") is MultiAgentEnv.reset
    assert registry.resolve(Recorder) is Recorder
    with pytest.raises(RegistrationError, match="'module:attr'"):
        registry.resolve("corral.env")


def test_duplicate_id_is_an_error() -> None:
    register("test/once", Recorder)
    with pytest.raises(RegistrationError, match="'test/once' is already registered"):
        register("test/once", Recorder)


@pytest.mark.parametrize("bad_id", ["noslash", "spread"])
def test_id_without_source_is_an_error(bad_id: str) -> None:
    with pytest.raises(RegistrationError, match=f"'mine/{bad_id}'"):
        register(bad_id, Recorder)


def test_an_id_that_reads_as_code_to_import_is_refused() -> None:
    """``mine:x/y`` was registered, then read by make as the entry point ``mine:x/y``."""
    with pytest.raises(RegistrationError, match="no ':' before the '/'"):
        register("mine:x/y", Recorder)


@pytest.mark.parametrize(
    ("prefix", "factory", "said"),
    [
        ("a/b", print, "a name without '/' or ':', got 'a/b'"),
        ("", print, "got ''"),
        ("mod:x", print, "got 'mod:x'"),
        ("fine", 42, "the factory of namespace 'fine' must be a callable or 'module:attr'"),
    ],
)
def test_a_namespace_that_could_never_build_is_refused(
    prefix: str, factory: Any, said: str
) -> None:
    with pytest.raises(RegistrationError) as err:
        register_namespace(prefix, factory)
    assert said in str(err.value)


def test_entry_point_must_be_callable_or_string() -> None:
    with pytest.raises(RegistrationError, match="callable or 'module:attr'"):
        register("test/number", 42)  # type: ignore[arg-type]


def test_unknown_id_names_close_ids() -> None:
    register("test/simple_spread_v3", Recorder)
    register("test/simple_tag_v3", Recorder)
    with pytest.raises(UnknownEnvError) as err:
        make("test/simple_sprad_v3")
    message = str(err.value)
    assert "unknown env id 'test/simple_sprad_v3'" in message
    assert "Did you mean test/simple_spread_v3" in message
    assert "corral list" in message
    assert isinstance(err.value, LookupError)


def test_unknown_id_suggests_ids_containing_it() -> None:
    register("test/pong_duel_v1", Recorder)
    with pytest.raises(UnknownEnvError, match=r"Did you mean .*test/pong_duel_v1"):
        spec("duel")


def test_unknown_id_with_nothing_close_lists_sources() -> None:
    register("test/recorder", Recorder)
    with pytest.raises(UnknownEnvError) as err:
        spec("zzz/qqqqqqqq")
    assert "Did you mean" not in str(err.value)
    assert "test/..." in str(err.value)


def test_unknown_builtin_id_suggests_the_builtin() -> None:
    if "mpe2/simple_spread_v3" not in registered_ids():
        pytest.skip("mpe2/simple_spread_v3 is not registered")
    with pytest.raises(UnknownEnvError, match="Did you mean mpe2/simple_spread_v3"):
        spec("mpe2/simple_sprad_v3")


def test_missing_third_party_module_names_the_extra() -> None:
    register("test/fancy", needs_missing_package, extra="fancy")
    with pytest.raises(MissingDependencyError) as err:
        make("test/fancy")
    message = str(err.value)
    assert "'test/fancy'" in message
    assert "'fancy_sim'" in message
    assert "pip install 'corral[fancy]'" in message
    assert isinstance(err.value, ImportError)


def test_missing_module_of_a_string_entry_point_names_the_extra() -> None:
    register("test/fancy-lazy", "fancy_sim.envs:Env", extra="fancy")
    with pytest.raises(MissingDependencyError, match=r"pip install 'corral\[fancy\]'"):
        make("test/fancy-lazy")


def test_missing_module_without_extra_is_not_rewritten() -> None:
    register("test/plain", needs_missing_package)
    with pytest.raises(ModuleNotFoundError) as err:
        make("test/plain")
    assert not isinstance(err.value, MissingDependencyError)


def test_make_adapts_what_the_entry_point_returns() -> None:
    register("test/not-an-env", object)
    with pytest.raises(TypeError, match="is not a multi-agent env"):
        make("test/not-an-env")


def test_namespace_builds_any_name() -> None:
    register_namespace("testns", Recorder)
    env = make("testns/anything-v0", size=2)
    assert isinstance(env, Recorder)
    assert env.args == ("anything-v0",)
    assert env.kwargs == {"size": 2}
    assert "testns" in namespaces()
    assert not registered_ids("testns")
    with pytest.raises(UnknownEnvError):
        spec("testns/")


def test_namespace_twice_is_an_error() -> None:
    register_namespace("testns", Recorder)
    with pytest.raises(RegistrationError, match="'testns' is already registered"):
        register_namespace("testns", Recorder)


def test_namespace_missing_dependency_names_its_extra() -> None:
    def factory(name: str) -> Any:
        raise ModuleNotFoundError("No module named 'fancy_sim'", name="fancy_sim")

    register_namespace("fancyns", factory, extra="fancy")
    with pytest.raises(MissingDependencyError, match=r"corral\[fancy\]"):
        make("fancyns/anything")


def test_a_name_its_namespace_does_not_know_is_unknown_before_anything_is_built() -> None:
    def names(name: str) -> list[str] | None:
        return None if name == "known-v0" else ["known-v0", "other-v0"]

    built = []
    register_namespace(
        "testns", lambda name, **kw: built.append(name) or Recorder(name), names=names
    )
    with pytest.raises(UnknownEnvError) as err:
        spec("testns/knwn-v0")
    assert str(err.value).startswith("unknown env id 'testns/knwn-v0': testns knows no env")
    assert "Did you mean testns/known-v0" in str(err.value)
    assert built == []
    assert make("testns/known-v0").args == ("known-v0",)


def test_a_misspelt_gymnasium_id_is_an_unknown_env_error_naming_the_closest() -> None:
    with pytest.raises(UnknownEnvError, match="Did you mean gym/CartPole-v1") as err:
        make("gym/CartPol-v1")
    assert isinstance(err.value, LookupError)
    with pytest.raises(UnknownEnvError, match="'gym/NoSuchEnv-v0': gym knows no env"):
        make("gym/NoSuchEnv-v0")


GYMNASIUM_NAMES = [
    "CartPole-v1",
    "CartPole-v0",
    "CartPole",  # the latest version
    "Blackjack-v1",
    "phys2d/CartPole-v1",  # known, though it needs jax to build
    "CartPol-v1",
    "cartpole-v1",
    "CartPole-v9",
    "ALE/Pong-v5",  # a namespace that is not installed
    "NoSuchEnv-v0",
]


@pytest.mark.parametrize("name", GYMNASIUM_NAMES)
def test_gym_ids_are_unknown_exactly_where_gymnasium_make_finds_no_env(name: str) -> None:
    import gymnasium

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # an old or unversioned id
            gymnasium.make(name).close()
    except gymnasium.error.UnregisteredEnv:
        found = False
    except ImportError:  # found, but its dependencies are not installed
        found = True
    else:
        found = True
    if found:
        assert spec(f"gym/{name}").id == f"gym/{name}"
    else:
        with pytest.raises(UnknownEnvError):
            spec(f"gym/{name}")


OPENSPIEL_NAMES = ["kuhn_poker", "kuhn_poker(players=3)", "goofspiel", "kuhn_pokr", "tictactoe"]


@pytest.mark.parametrize("name", OPENSPIEL_NAMES)
def test_openspiel_ids_are_unknown_exactly_where_openspiel_has_no_game(name: str) -> None:
    pyspiel = pytest.importorskip("pyspiel")
    try:
        pyspiel.load_game(name)
    except pyspiel.SpielError:
        with pytest.raises(UnknownEnvError, match=f"openspiel knows no env '{re.escape(name)}'"):
            spec(f"openspiel/{name}")
    else:
        assert spec(f"openspiel/{name}").id == f"openspiel/{name}"


def test_a_misspelt_openspiel_game_names_the_closest() -> None:
    pytest.importorskip("pyspiel")
    with pytest.raises(UnknownEnvError, match="Did you mean openspiel/kuhn_poker"):
        make("openspiel/kuhn_pokr")


def test_an_entry_point_id_builds_what_it_names() -> None:
    env = make("corral.envs.rps:RockPaperScissors", num_rounds=2)
    assert type(env) is RockPaperScissors and env.num_rounds == 2
    assert spec("corral.envs.rps:RockPaperScissors").batched is None
    native = spec("corral.envs.tag_batched:BatchedTag")
    assert native.entry_point is None and native.batched is not None
    venv = corral.make_vec("corral.envs.tag_batched:BatchedTag", 2, seed=0)
    try:
        assert venv.native and venv.num_envs == 2
    finally:
        venv.close()


def test_an_entry_point_id_that_cannot_be_found_is_unknown() -> None:
    with pytest.raises(UnknownEnvError, match="cannot import 'no_such_module_anywhere'"):
        spec("no_such_module_anywhere:Env")
    with pytest.raises(UnknownEnvError, match="has no attribute 'Nope'"):
        spec("corral.envs.rps:Nope")


def test_an_id_of_an_unknown_source_says_how_to_make_it_known() -> None:
    with pytest.raises(UnknownEnvError) as err:
        spec("mine/new_env_mas")
    message = str(err.value)
    assert "No env of source 'mine' is registered" in message
    assert "--import MODULE" in message and "'corral.envs'" in message


def test_import_modules_names_a_module_that_cannot_be_imported() -> None:
    with pytest.raises(RegistrationError, match="cannot import the module 'no_such_mod_xyz'"):
        registry.import_modules(["no_such_mod_xyz"])


def test_an_installed_package_s_ids_load_through_its_entry_points(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = f"plug{uuid.uuid4().hex[:8]}"
    module = f"{source}_envs"
    points = {source: module, f"{source}-more": f"{module}:more"}
    installed_package(tmp_path, points, {module: plugin_module(source)})
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert spec("corral/rps").id == "corral/rps"
        assert module not in sys.modules  # loaded only when an id is not found
        assert type(make(f"{source}/rps")) is RockPaperScissors
        assert module in sys.modules
        assert registered_ids(source) == [f"{source}/more", f"{source}/rps"]  # more() ran
    finally:
        sys.modules.pop(module, None)


def test_an_entry_point_that_cannot_be_loaded_names_its_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dist = installed_package(tmp_path, {"broken": "no_such_plugin_module_xyz"}, {})
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RegistrationError) as err:
        spec("mine/anything")
    message = str(err.value)
    assert f"'broken = no_such_plugin_module_xyz' of package '{dist}'" in message
    assert "group corral.envs" in message and "no_such_plugin_module_xyz" in message
    with pytest.raises(UnknownEnvError):  # tried once
        spec("mine/anything")


def test_an_entry_point_that_raises_or_registers_a_taken_id_names_its_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plugin's own error (not only ImportError): a traceback out of corral list, or
    "already registered" without a word of which package."""
    module = f"plug{uuid.uuid4().hex[:8]}_envs"
    code = (
        "import corral\n\n"
        "def broken():\n    raise ValueError('plugin config broken')\n\n"
        "def taken():\n    corral.register('corral/tag', 'corral.envs.rps:RockPaperScissors')\n"
    )
    for attr, said in [
        ("broken", "ValueError: plugin config broken"),
        ("taken", "RegistrationError: env id 'corral/tag' is already registered"),
    ]:
        dist = installed_package(tmp_path / attr, {attr: f"{module}:{attr}"}, {module: code})
        monkeypatch.syspath_prepend(str(tmp_path / attr))
        with pytest.raises(RegistrationError) as err:
            registered_ids()
        assert f"'{attr} = {module}:{attr}' of package '{dist}'" in str(err.value)
        assert said in str(err.value)
    sys.modules.pop(module, None)


def test_an_id_of_corral_s_own_is_taken_before_any_lookup() -> None:
    """In a fresh process, registering ``corral/tag`` (or the ``gym`` namespace) before any
    lookup was accepted, and then every lookup failed, the registry left half loaded."""
    code = (
        "import corral\n"
        "from corral.errors import RegistrationError\n"
        "for call in (lambda: corral.register('corral/tag', 'corral.envs.rps:RockPaperScissors'),\n"
        "             lambda: corral.register_namespace('gym', print)):\n"
        "    try:\n"
        "        call()\n"
        "    except RegistrationError as err:\n"
        "        print(err)\n"
        "print(type(corral.make('corral/rps')).__name__, len(corral.registered_ids()) > 50)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "env id 'corral/tag' is already registered",
        "namespace 'gym' is already registered",
        "RockPaperScissors True",
    ]


def test_an_id_registered_only_batched_says_how_to_build_it() -> None:
    register("mine/tag-batched", batched="corral.envs.tag_batched:BatchedTag")
    with pytest.raises(RegistrationError) as err:
        make("mine/tag-batched")
    assert "use corral.make_vec('mine/tag-batched', num_envs)" in str(err.value)
    assert "make_batched" not in str(err.value)  # no such function
    with corral.make_vec("mine/tag-batched", 2) as venv:
        assert venv.native
    for given in ({"native": False}, {"group_map": "agent"}):
        with pytest.raises(ValueError, match="registered only natively batched, with its own"):
            corral.make_vec("mine/tag-batched", 2, **given)


def test_registered_id_wins_over_its_namespace() -> None:
    register_namespace("testns", lambda name: pytest.fail("namespace used"))
    register("testns/fixed", Recorder, size=1)
    assert make("testns/fixed").kwargs == {"size": 1}


def test_top_level_api_is_the_registry() -> None:
    assert corral.make is make
    assert corral.register is register
    assert corral.registered_ids is registered_ids


@pytest.mark.parametrize(
    "code",
    ["import corral", "import corral; corral.registered_ids()"],
    ids=["import", "load builtins"],
)
def test_optional_packages_are_not_imported(code: str) -> None:
    probe = f"{code}; import sys; print([m for m in {OPTIONAL_PACKAGES!r} if m in sys.modules])"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"


SOURCE = Path(corral.__file__).parent
MODULES = {
    ".".join(path.relative_to(SOURCE.parent).with_suffix("").parts).removesuffix(".__init__"): path
    for path in SOURCE.rglob("*.py")
}


_TYPE_CHECKING = {"TYPE_CHECKING", "typing.TYPE_CHECKING"}


def imported(path: Path) -> set[str]:
    """The corral modules that the module at ``path`` imports, at any level: by ``import``
    statements, and by name (a string ``"corral.x"``, or an entry point ``"corral.x:attr"``).
    Imports under ``if TYPE_CHECKING:`` are left out: the type checker's, never run."""
    names = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for block in ast.walk(tree):
        if isinstance(block, ast.If) and ast.unparse(block.test) in _TYPE_CHECKING:
            block.body = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0 and node.module, f"{path}: a relative import"
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value.partition(":")[0])
    return names & set(MODULES)


def import_chains(starts: Iterable[str]) -> dict[str, list[str]]:
    """Every corral module reached from ``starts`` by imports -> a chain of imports to it."""
    graph = {name: imported(path) for name, path in MODULES.items()}
    chains = {name: [name] for name in starts}
    todo = list(chains)
    while todo:
        name = todo.pop()
        for other in sorted(graph[name] - set(chains)):
            chains[other] = [*chains[name], other]
            todo.append(other)
    return chains


def test_the_registry_adapts_and_the_adapters_know_no_registry() -> None:
    assert "corral.adapters" in imported(MODULES["corral.registry"])
    adapters = [name for name in MODULES if name.split(".")[:2] == ["corral", "adapters"]]
    chains = import_chains(adapters)
    assert "corral.registry" not in chains, " -> ".join(chains["corral.registry"])
