"""Finding node, the npm emulators, and forcing their servers onto 127.0.0.1."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from shardflow.errors import EmulatorNotInstalledError, NodeModulesNotFoundError
from shardflow.local import KinesaliteServer, KinesisLocalServer
from shardflow.local.node import (
    NPM_PACKAGES,
    fetch_package,
    find_package,
    loopback_preload,
    node_executable,
)

ROOT = Path(__file__).resolve().parents[3]


def fake_package(node_modules: Path, name: str) -> Path:
    package = node_modules / name
    package.mkdir(parents=True)
    (package / "package.json").write_text(json.dumps({"name": name}))
    return package


def test_found_by_walking_up_from_the_start_directory(tmp_path: Path) -> None:
    package = fake_package(tmp_path / "project" / "node_modules", "fake-emulator")
    deep = tmp_path / "project" / "src" / "deeper"
    deep.mkdir(parents=True)
    assert find_package("fake-emulator", start=deep) == package.resolve()


def test_override_variable_is_used_instead_of_searching(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = fake_package(tmp_path / "elsewhere", "fake-emulator")
    monkeypatch.setenv("SHARDFLOW_NODE_MODULES", str(tmp_path / "elsewhere"))
    assert find_package("fake-emulator", start=tmp_path) == package.resolve()


def test_missing_package_says_how_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHARDFLOW_NODE_MODULES", str(tmp_path))
    with pytest.raises(NodeModulesNotFoundError, match=r"npm ci") as raised:
        find_package("kinesalite")
    assert str(tmp_path) in str(raised.value)
    assert isinstance(raised.value, EmulatorNotInstalledError)


def test_pinned_versions_are_the_checkout_s(tmp_path: Path) -> None:
    assert json.loads((ROOT / "package.json").read_text())["dependencies"] == NPM_PACKAGES


def test_found_in_the_user_cache_when_no_checkout_has_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHARDFLOW_CACHE_DIR", str(tmp_path / "cache"))
    package = fake_package(tmp_path / "cache" / "node" / "node_modules", "fake-emulator")
    assert find_package("fake-emulator", start=tmp_path) == package.resolve()


def test_without_npm_the_error_is_the_one_command_to_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(NodeModulesNotFoundError) as raised:
        fetch_package("kinesalite", tmp_path / "cache")
    assert f"npm install --prefix {tmp_path / 'cache'}" in str(raised.value)
    assert f"kinesalite@{NPM_PACKAGES['kinesalite']}" in str(raised.value)


@pytest.mark.skipif(shutil.which("npm") is None, reason="npm is not installed")
def test_a_pip_user_gets_the_pinned_emulator_fetched_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = tmp_path / "cache" / "node"
    package = fetch_package("kinesalite", prefix)
    assert package == (prefix / "node_modules" / "kinesalite").resolve()
    manifest = json.loads((package / "package.json").read_text())
    assert manifest["version"] == NPM_PACKAGES["kinesalite"]
    assert "fetching kinesalite@" in capsys.readouterr().err


@pytest.mark.parametrize("server_class", [KinesisLocalServer, KinesaliteServer])
def test_server_without_its_package_fails_typed_before_starting(
    server_class: type[KinesisLocalServer | KinesaliteServer],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SHARDFLOW_NODE_MODULES", str(tmp_path))
    server = server_class(log_dir=tmp_path)
    with pytest.raises(NodeModulesNotFoundError, match=server_class.package):
        server.start()
    assert not server.running


def test_missing_node_is_a_typed_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(EmulatorNotInstalledError, match=r"Node\.js"):
        node_executable()


LISTEN_CALLS = {
    "port only": "server.listen(0, report)",
    "port and every interface": "server.listen(0, '0.0.0.0', report)",
    "port and IPv6 any": "server.listen(0, '::', report)",
    "port, host and backlog": "server.listen(0, '0.0.0.0', 16, report)",
    "port and backlog": "server.listen(0, 16, report)",
    "port as string": "server.listen('0', report)",
    "options object": "server.listen({port: 0, host: '0.0.0.0'}, report)",
    "options without host": "server.listen({port: 0}, report)",
    "no arguments": "server.listen(); server.on('listening', report)",
}


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
@pytest.mark.parametrize("call", LISTEN_CALLS.values(), ids=LISTEN_CALLS.keys())
def test_preload_forces_every_listen_onto_loopback(call: str) -> None:
    script = (
        "const server = require('http').createServer();"
        "function report() { console.log(server.address().address); server.close() }"
        f"{call}"
    )
    result = subprocess.run(
        ["node", "-r", str(loopback_preload()), "-e", script],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert result.stdout.strip() == "127.0.0.1"


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_preload_leaves_unix_sockets_alone(tmp_path: Path) -> None:
    socket_path = tmp_path / "emulator.sock"
    script = (
        "const server = require('net').createServer();"
        f"server.listen({json.dumps(str(socket_path))}, () => "
        "{ console.log(server.address()); server.close() })"
    )
    result = subprocess.run(
        ["node", "-r", str(loopback_preload()), "-e", script],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert result.stdout.strip() == str(socket_path)
