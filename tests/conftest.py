"""Settings for every test: AWS configuration that can only reach local emulators.

Dummy credentials and region ``us-east-1``; a developer's profile, endpoint overrides and
~/.aws files never leak in (the config and credentials files point at paths that do not exist).

Under pytest-xdist (``make test``) the tests are handed out longest first, a few kept together
on one worker (:mod:`support.ordering`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.ordering import group_of, known_durations, longest_first

pytest_plugins = ["support.cpu_report"]

DUMMY_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    # Never wait for an instance metadata service that is not there.
    "AWS_EC2_METADATA_DISABLED": "true",
}
#: Variables that could redirect or re-authenticate SDK calls.
CLEARED_ENV = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_REGION",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_ENDPOINT_URL",
)


def _isolate_aws(patch: pytest.MonkeyPatch, missing_dir: Path) -> None:
    for name in CLEARED_ENV:
        patch.delenv(name, raising=False)
    for name in list(os.environ):
        if name.startswith("AWS_ENDPOINT_URL_"):
            patch.delenv(name)
    for name, value in DUMMY_ENV.items():
        patch.setenv(name, value)
    patch.setenv("AWS_CONFIG_FILE", str(missing_dir / "config"))
    patch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(missing_dir / "credentials"))


@pytest.fixture(scope="session")
def _missing_aws_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # A fresh empty directory: "config" and "credentials" inside it do not exist.
    return tmp_path_factory.mktemp("no-aws-config")


@pytest.fixture(scope="session", autouse=True)
def _aws_isolated_session(_missing_aws_dir: Path) -> Iterator[None]:
    """The same isolation for session-scoped fixtures (they run before per-test fixtures)."""
    with pytest.MonkeyPatch.context() as patch:
        _isolate_aws(patch, _missing_aws_dir)
        yield


@pytest.fixture(autouse=True)
def _aws_isolated(monkeypatch: pytest.MonkeyPatch, _missing_aws_dir: Path) -> None:
    """Every test starts from the isolated AWS environment, whatever earlier tests changed."""
    _isolate_aws(monkeypatch, _missing_aws_dir)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput"):
        return  # not an xdist worker: the tests run in the order of their files
    items[:] = longest_first(items, known_durations())
    for item in items:
        group = group_of(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
