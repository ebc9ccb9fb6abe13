"""The README's and the documentation site's code, and the demo, run as written; the site
builds without a warning."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import tomllib
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from support.published import sdist_of
from support.uvicorn_server import Uvicorn

ROOT = Path(__file__).resolve().parent.parent
#: What an index shows as the package's description (pyproject's ``readme``).
DESCRIPTION = ROOT / "package-description.md"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# Every Python block of every page, by "<page>:<n>" (its n-th block there).
BLOCKS = {
    f"{page.relative_to(ROOT)}:{n}": code
    for page in PAGES
    for n, code in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(), re.S))
}


def block_with(marker: str) -> str:
    (name,) = [name for name, code in BLOCKS.items() if marker in code]
    return name


FIRST_EXAMPLE = block_with("stream_lease(user=current_user))]\n\n\n@app.get")
QUICKSTART = block_with("lease.wrap(token_generator())")
STREAM_FORMS = block_with("BudgetedLease = Annotated[")
WEBSOCKET = block_with("async def websocket_chat")
LIMITER = block_with('@app.get("/both"')
LLM_PROXY = block_with("def budgets(team: str, model: str)")


def load_block(name: str, redis_url: str, tmp_path: Path):
    """Runs block ``name`` as a module, pointed at the test's Redis."""
    code = BLOCKS[name].replace("redis://localhost:6379", redis_url)
    path = tmp_path / ("docs_block_" + re.sub(r"\W", "_", name) + ".py")
    path.write_text(code)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_pages_have_the_blocks_these_tests_expect():
    assert FIRST_EXAMPLE == "README.md:0"
    assert QUICKSTART == "README.md:1"
    for recipe in (ROOT / "docs" / "recipes").glob("*.md"):  # each recipe shows its code
        assert f"{recipe.relative_to(ROOT)}:0" in BLOCKS, recipe.name


def test_readme_quickstart(redis_server, tmp_path):
    module = load_block(QUICKSTART, redis_server.url, tmp_path)
    with TestClient(module.app) as client:
        response = client.get("/api/chat/stream")
        assert response.status_code == 200
        assert "data: streamed!" in response.text


def test_readme_first_example_streams_native_sse_under_a_lease(redis_server, tmp_path):
    module = load_block(FIRST_EXAMPLE, redis_server.url, tmp_path)
    with TestClient(module.app) as client:
        response = client.get("/api/chat/stream")
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert 'data: "streamed!"' in response.text


def test_stream_forms_block(tmp_path):
    module = load_block(STREAM_FORMS, "", tmp_path)
    with TestClient(module.app) as client:
        assert client.post("/chat").text == 'data: "Hello"\n\ndata: "world"\n\n'
        assert client.get("/lines").text == '{"n":0}\n{"n":1}\n{"n":2}\n'
        with client.websocket_connect("/ws") as websocket:
            assert websocket.receive_text() == "admitted"


def test_limiter_block(redis_server, tmp_path):
    module = load_block(LIMITER, redis_server.url, tmp_path)
    with TestClient(module.app) as client:
        assert client.get("/messages").json() == []
        assert client.get("/both").json() == "ok"


def test_websocket_block(redis_server, tmp_path):
    module = load_block(WEBSOCKET, redis_server.url, tmp_path)
    with TestClient(module.app) as client:
        # The example loops until the client leaves, which Starlette reports by raising.
        with pytest.raises(WebSocketDisconnect), client.websocket_connect("/ws/chat/u1") as ws:
            ws.send_text("hi")
            assert ws.receive_text() == "Echo: hi"


def test_the_llm_proxy_recipe_charges_every_level_in_its_unit(redis_server, tmp_path):
    module = load_block(LLM_PROXY, redis_server.url, tmp_path)
    alice = {"x-user-id": "alice"}
    ask = {"messages": [{"role": "user", "content": "one two three"}], "max_tokens": 3}
    with TestClient(module.app) as client:

        def ask_for(model: str):
            return client.post("/v1/chat/completions", json={**ask, "model": model}, headers=alice)

        unknown = ask_for("gpt-9")
        assert unknown.status_code == 400 and "use one of ['gpt-mini', 'gpt-x']" in unknown.text
        answer = ask_for("gpt-mini")
        assert answer.status_code == 200 and '"usage"' in answer.text
        levels = client.get("/usage", headers=alice).json()
    # 3 prompt tokens at 0.15 and 3 answer tokens at 0.6 microdollars, rounded up once: 3.
    spent = {"unit": "cost", "used": 3}
    in_units = {name: {"unit": lv["unit"], "used": lv["used"]} for name, lv in levels.items()}
    assert in_units == {
        "team_spend_per_day": spent,
        "user_spend_per_day": spent,
        "tokens_per_minute": {"unit": "tokens", "used": 6},
        "requests_per_minute": {"unit": "requests", "used": 1},
        "model_spend_per_day:gpt-x": {"unit": "cost", "used": 0},
        "model_spend_per_day:gpt-mini": spent,
    }


@pytest.mark.parametrize(
    "name",
    [
        name
        for name in BLOCKS
        if name not in (FIRST_EXAMPLE, QUICKSTART, STREAM_FORMS, WEBSOCKET, LIMITER, LLM_PROXY)
    ],
)
def test_every_other_block_runs(redis_server, tmp_path, name):
    load_block(name, redis_server.url, tmp_path)


def test_no_page_installs_the_other_package_from_the_index():
    """docs/index.md said ``pip install fastapi-stream-lease``, which installs the pure-Python
    0.6 line from PyPI, not this package: every install line names a wheel or a source tree."""
    sources = [*PAGES, *(ROOT / "python").rglob("*.py"), *(ROOT / "examples").rglob("*.py")]
    from_the_index = re.compile(r"pip install\s+['\"]?fastapi[-_]stream[-_]lease\b")
    for source in sources:
        for line in source.read_text().splitlines():
            assert not from_the_index.search(line), f"{source.relative_to(ROOT)}: {line}"
    index = (ROOT / "docs" / "index.md").read_text()
    assert "make wheel" in index and "pip install dist/fastapi_stream_lease-" in index
    readme = (ROOT / "README.md").read_text()
    assert "built from this repository; it is not on PyPI" in readme
    assert "holds the pure-Python 0.6 line" in readme
    # The package's description says it too, as an index shows it.
    description = DESCRIPTION.read_text()
    assert "It is not on PyPI" in description and "holds the pure-Python 0.6 line" in description


def test_the_package_description_has_no_link_or_image_an_index_would_break():
    """An index shows the description alone, away from this tree: a relative link or image
    there leads nowhere, so it has none, and names the files it points to as text."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["readme"] == DESCRIPTION.name
    text = DESCRIPTION.read_text()
    assert "![" not in text and "<img" not in text.lower()
    targets = re.findall(r"\]\(([^)]*)\)", text) + re.findall(r"href=[\"']([^\"']*)", text)
    assert all(target.startswith("https://") for target in targets), targets


def test_the_package_description_shows_the_readmes_first_example_as_it_runs():
    """Its one code block is the README's first example, which the tests above run."""
    blocks = re.findall(r"```python\n(.*?)```", DESCRIPTION.read_text(), re.S)
    assert blocks == [BLOCKS[FIRST_EXAMPLE]]


def test_the_0_6_line_on_the_index_fails_the_first_example_with_the_error_the_pages_name():
    """The README and the package description say what installing the name from PyPI gets:
    0.6.3, on which the first example's import fails as they quote."""
    sdist = sdist_of("fastapi-stream-lease", "0.6.3")
    (package,) = {path.parent.parent for path in sdist.rglob("fastapi_stream_lease/__init__.py")}
    imports = [line for line in BLOCKS[FIRST_EXAMPLE].splitlines() if "import Lease" in line]
    done = subprocess.run(
        [sys.executable, "-c", imports[0]],
        env={**os.environ, "PYTHONPATH": str(package)},
        cwd=package,
        capture_output=True,
        text=True,
        timeout=60,
    )
    quoted = "ImportError: cannot import name 'Lease'"
    assert quoted in done.stderr
    assert quoted in (ROOT / "README.md").read_text() and quoted in DESCRIPTION.read_text()


def test_the_site_builds_without_warnings(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_demo_tells_the_story_and_exits_0(redis_server, backend):
    env = {"REDIS_URL": redis_server.url} if backend == "redis" else {}
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo.py")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**{k: v for k, v in os.environ.items() if k != "REDIS_URL"}, **env},
    )
    assert done.returncode == 0, done.stderr
    assert "stream 3: HTTP 429, Retry-After:" in done.stdout
    assert "stream 3: HTTP 200" in done.stdout
    assert "demo done" in done.stdout
    # The reader did not leave a secret out: no warning that says they did.
    assert "StreamLeaseWarning" not in done.stderr, done.stderr


def test_the_websocket_recipe_as_copied_closes_a_third_socket_with_1008(redis_server, tmp_path):
    """The recipe without ``install_exception_handler(app)``: a user's third socket gave the
    server a traceback and the client no close frame. Run under uvicorn as the page shows it."""
    (recipe,) = [n for n, code in BLOCKS.items() if "async def chat(websocket" in code]
    (tmp_path / "websocket_recipe.py").write_text(BLOCKS[recipe])
    log = tmp_path / "server.log"
    server = Uvicorn("websocket_recipe:app", tmp_path, {"REDIS_URL": redis_server.url}, log=log)
    url = server.base_url.replace("http://", "ws://") + f"/ws/{uuid.uuid4().hex}"
    try:
        with connect(url) as first, connect(url) as second:
            for websocket in (first, second):
                websocket.send("hi")
                assert websocket.recv(timeout=10) == "echo: hi"
            with connect(url) as third:
                with pytest.raises(ConnectionClosed) as closed:
                    third.recv(timeout=10)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
            assert closed.value.rcvd.reason == "Too many concurrent streams"
            first.send("still here")
            assert first.recv(timeout=10) == "echo: still here"
    finally:
        server.stop()
    assert "Traceback" not in log.read_text()


def test_the_reference_has_every_public_name_and_each_config_argument_described():
    """The reference lacked ``TOP_UP_INCREMENT``, ``StreamLease`` and ``StreamLeaseLost``, and
    showed ``LeaseConfig`` as bare properties, with no constructor, defaults or descriptions."""
    import fastapi_stream_lease
    from fastapi_stream_lease import LeaseConfig

    reference = (ROOT / "docs" / "reference.md").read_text()
    for name in fastapi_stream_lease.__all__:
        assert f"fastapi_stream_lease.{name}\n" in reference or f"`{name}`" in reference, name
    stub = (ROOT / "python" / "fastapi_stream_lease" / "_core.pyi").read_text()
    documented = stub.split("class LeaseConfig:", 1)[1].split("Args:", 1)[1].split('"""', 1)[0]
    described = re.findall(r"^            (\w+): ", documented, re.M)
    signature = LeaseConfig.__text_signature__ or ""
    arguments = [name for name in re.findall(r"(\w+)=None", signature)]
    assert described == arguments


def test_the_testing_pages_test_passes(tmp_path):
    """The testing page's example is a test: it runs here as a reader's pytest would run it."""
    module = load_block(block_with("async def test_a_third_stream_of_one_user_is_refused"), "",
                        tmp_path)  # fmt: skip
    asyncio.run(module.test_a_third_stream_of_one_user_is_refused())
