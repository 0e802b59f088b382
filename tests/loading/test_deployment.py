"""`deployment.toml`: agents (id, package, max_concurrent_calls) and data mounts."""

from __future__ import annotations

import pytest

from broker.constants import DEFAULT_MAX_CONCURRENT_CALLS

from .conftest import DEPLOYMENT, Tree

FILE = "deployment.toml"
GUIDE_AGENT = '[[agents]]\nid = "guide"\npackage = "guide"\n'


def test_the_valid_deployment_loads(tree: Tree) -> None:
    deployment = tree.load()
    assert list(deployment.agents) == ["guide", "records"]
    guide = deployment.agent("guide")
    assert guide.package_dir == (tree.root / "guide").resolve()
    assert guide.mounts == {"/data": (tree.root / "data").resolve()}
    assert guide.max_concurrent_calls == DEFAULT_MAX_CONCURRENT_CALLS
    assert guide.grants == {}
    assert str(deployment.path) == FILE


def test_max_concurrent_calls_is_read(tree: Tree) -> None:
    tree.write({FILE: GUIDE_AGENT + "max_concurrent_calls = 3\n"})
    assert tree.load().agent("guide").max_concurrent_calls == 3


@pytest.mark.parametrize(
    ("text", "field", "fragment"),
    [
        ("", "agents", "missing: declare at least one [[agents]]"),
        ("agents = []\n", "agents", "at least one agent"),
        ('agents = "guide"\n', "agents", "must be a list of tables"),
        ('[agents]\nid = "guide"\n', "agents", "must be a list of tables"),
        ("agents = [1]\n", "agents[0]", "must be a table ([[agents]]), not an integer"),
        ('agents = [{ id = "guide", package = "guide" }, "x"]\n', "agents[1]", "not a string"),
        ('agent = "x"\n' + GUIDE_AGENT, "agent", "did you mean 'agents'"),
        ('[[agents]]\npackage = "guide"\n', "agents[0].id", "missing"),
        ('[[agents]]\nid = "Guide"\npackage = "guide"\n', "agents[0].id", "lowercase letters"),
        ('[[agents]]\nid = "guide_1"\npackage = "guide"\n', "agents[0].id", "hyphens"),
        (
            '[[agents]]\nid = "1guide"\npackage = "guide"\n',
            "agents[0].id",
            "starting with a letter",
        ),
        (f'[[agents]]\nid = "{"g" * 64}"\npackage = "guide"\n', "agents[0].id", "up to 63"),
        ("[[agents]]\nid = 1\npackage = 'guide'\n", "agents[0].id", "not an integer"),
        (GUIDE_AGENT + GUIDE_AGENT, "agents[1].id", "'guide' is already the id of agents[0]"),
        ('[[agents]]\nid = "guide"\n', "agents[0].package", "missing"),
        ('[[agents]]\nid = "guide"\npackage = "nowhere"\n', "agents[0].package", "does not exist"),
        (
            '[[agents]]\nid = "guide"\npackage = "data/hello.txt"\n',
            "agents[0].package",
            "is not a folder",
        ),
        ('[[agents]]\nid = "guide"\npackage = "data"\n', "agents[0].package", "has no vessel.toml"),
        (GUIDE_AGENT + "max_concurrent_calls = 0\n", "agents[0].max_concurrent_calls", "positive"),
        (
            GUIDE_AGENT + "max_concurrent_calls = 1.5\n",
            "agents[0].max_concurrent_calls",
            "must be an integer",
        ),
        (
            GUIDE_AGENT + "max_concurrent_calls = true\n",
            "agents[0].max_concurrent_calls",
            "not a boolean",
        ),
        (GUIDE_AGENT + 'packages = "x"\n', "agents[0].packages", "did you mean 'package'"),
        (GUIDE_AGENT + 'mounts = "data"\n', "agents[0].mounts", "must be a table"),
        (GUIDE_AGENT + 'services = "records"\n', "agents[0].services", "must be a table"),
    ],
)
def test_an_invalid_agent_is_refused(tree: Tree, text: str, field: str, fragment: str) -> None:
    tree.expect({FILE: text}, FILE, field, fragment)


def mount(target: str, source: str = '"data"') -> dict[str, str]:
    return {FILE: GUIDE_AGENT + f"[agents.mounts]\n{target} = {source}\n"}


@pytest.mark.parametrize(
    ("target", "field", "fragment"),
    [
        ('"data"', "agents[0].mounts.data", "not an absolute path"),
        ('"/data/../srv"', 'agents[0].mounts."/data/../srv"', '".." segment'),
        ('"/data/"', 'agents[0].mounts."/data/"', "not normalised"),
        ('"/data/./x"', 'agents[0].mounts."/data/./x"', "not normalised"),
        ('"/"', 'agents[0].mounts."/"', "cannot mount over /"),
        ('"/agent"', 'agents[0].mounts."/agent"', "the agent package"),
        ('"/agent/data"', 'agents[0].mounts."/agent/data"', "inside the system folder /agent"),
        ('"/etc"', 'agents[0].mounts."/etc"', "system folder /etc"),
        (
            '"/usr/share/data"',
            'agents[0].mounts."/usr/share/data"',
            "inside the system folder /usr",
        ),
        ('"/proc"', 'agents[0].mounts."/proc"', "system folder /proc"),
        ('"/tmp/vessel"', 'agents[0].mounts."/tmp/vessel"', "workspace /tmp/vessel"),
        ('"/tmp/vessel/outbox"', 'agents[0].mounts."/tmp/vessel/outbox"', "workspace"),
        ('"/tmp"', 'agents[0].mounts."/tmp"', "workspace"),
        ('"/tmp/other"', 'agents[0].mounts."/tmp/other"', "inside the system folder /tmp"),
    ],
)
def test_an_invalid_mount_target_is_refused(
    tree: Tree, target: str, field: str, fragment: str
) -> None:
    tree.expect(mount(target), FILE, field, fragment)


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        ('"nowhere"', "'nowhere' does not exist"),
        ('"data/hello.txt"', "'data/hello.txt' is not a folder"),
        ("1", "must be a string (a folder), not an integer"),
        ('""', "must name a folder"),
    ],
)
def test_an_invalid_mount_source_is_refused(tree: Tree, source: str, fragment: str) -> None:
    tree.expect(mount('"/data"', source), FILE, 'agents[0].mounts."/data"', fragment)


def test_mounts_may_nest_and_sit_anywhere_outside_system_folders(tree: Tree) -> None:
    tree.write({"more/x.txt": "x"})
    tree.write(
        {
            FILE: GUIDE_AGENT
            + '[agents.mounts]\n"/data" = "data"\n"/data/more" = "more"\n"/srv" = "more"\n'
        }
    )
    assert sorted(tree.load().agent("guide").mounts) == ["/data", "/data/more", "/srv"]


def test_problems_in_several_agents_are_all_reported(tree: Tree) -> None:
    broken = DEPLOYMENT.replace('id = "guide"', 'id = "Guide"').replace(
        'url = "http://127.0.0.1:8000"', 'url = "ftp://127.0.0.1"'
    )
    tree.write({FILE: broken, "guide/tools/echo.toml": 'name = "echo"\n'})
    fields = [line.split(": ")[:2] for line in tree.problems()]
    assert fields == [
        [FILE, "agents[0].id"],
        ["guide/tools/echo.toml", "description"],
        ["guide/tools/echo.toml", "command"],
        [FILE, "agents[1].services.records.url"],
    ]


def test_a_package_shared_by_agents_is_reported_once(tree: Tree) -> None:
    twice = GUIDE_AGENT + '[[agents]]\nid = "guide-two"\npackage = "guide"\n'
    line = tree.expect(
        {FILE: twice, "guide/tools/echo.toml": 'name = "echo"\ncommand = ["x"]\n'},
        "guide/tools/echo.toml",
        "description",
        "missing",
    )
    assert line


def test_a_shared_package_serves_each_agent(tree: Tree) -> None:
    tree.write({FILE: GUIDE_AGENT + '[[agents]]\nid = "guide-two"\npackage = "./guide"\n'})
    deployment = tree.load()
    assert deployment.agent("guide-two").tools.keys() == deployment.agent("guide").tools.keys()


def test_a_mount_of_the_host_root_is_refused(tree: Tree) -> None:
    tree.expect(mount('"/data"', '"/"'), FILE, 'agents[0].mounts."/data"', "host's root folder")


def test_a_mount_showing_the_deployment_file_is_refused(tree: Tree) -> None:
    tree.expect(mount('"/data"', '"."'), FILE, 'agents[0].mounts."/data"', "whose grants may hold")
