"""Which variables point an SDK at the local stack."""

from __future__ import annotations

import shlex
import subprocess

from shardflow.local.environment import client_environment, export_lines, url_variable

MOTO = "http://127.0.0.1:5000"
KINESIS_LOCAL = "http://127.0.0.1:5001"
KINESALITE = "http://127.0.0.1:5002"


def test_each_service_goes_where_it_is_served_and_each_server_is_named() -> None:
    env = client_environment(
        {"moto": MOTO, "kinesis-local": KINESIS_LOCAL, "kinesalite": KINESALITE}, current={}
    )
    assert env["AWS_ENDPOINT_URL"] == MOTO
    assert env["AWS_ENDPOINT_URL_KINESIS"] == KINESIS_LOCAL
    assert env["AWS_ENDPOINT_URL_DYNAMODB"] == MOTO
    assert env["AWS_ENDPOINT_URL_DYNAMODB_STREAMS"] == MOTO
    assert env["AWS_ENDPOINT_URL_CLOUDWATCH"] == MOTO
    assert env["SHARDFLOW_MOTO_URL"] == MOTO
    assert env["SHARDFLOW_KINESIS_LOCAL_URL"] == KINESIS_LOCAL
    assert env["SHARDFLOW_KINESALITE_URL"] == KINESALITE


def test_moto_alone_serves_kinesis_too() -> None:
    env = client_environment({"moto": MOTO}, current={})
    assert env["AWS_ENDPOINT_URL"] == env["AWS_ENDPOINT_URL_KINESIS"] == MOTO
    assert (
        client_environment({"moto": MOTO, "kinesalite": KINESALITE}, {})["AWS_ENDPOINT_URL_KINESIS"]
        == KINESALITE
    )


def test_without_moto_kinesis_goes_to_kinesis_local_first_then_kinesalite() -> None:
    both = client_environment({"kinesalite": KINESALITE, "kinesis-local": KINESIS_LOCAL}, {})
    assert both["AWS_ENDPOINT_URL_KINESIS"] == KINESIS_LOCAL
    assert "AWS_ENDPOINT_URL" not in both
    only_kinesalite = client_environment({"kinesalite": KINESALITE}, {})
    assert only_kinesalite["AWS_ENDPOINT_URL_KINESIS"] == KINESALITE


def test_dummy_credentials_and_region_only_when_missing() -> None:
    bare = client_environment({"moto": MOTO}, current={})
    assert bare["AWS_ACCESS_KEY_ID"] == bare["AWS_SECRET_ACCESS_KEY"] == "testing"
    assert bare["AWS_DEFAULT_REGION"] == "us-east-1"

    configured = client_environment(
        {"moto": MOTO}, current={"AWS_ACCESS_KEY_ID": "AKIAEXISTING", "AWS_REGION": "eu-west-1"}
    )
    assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"} & set(
        configured
    )


def test_url_variable_names() -> None:
    assert url_variable("kinesis-local") == "SHARDFLOW_KINESIS_LOCAL_URL"
    assert url_variable("moto") == "SHARDFLOW_MOTO_URL"


def test_export_lines_survive_a_real_shell() -> None:
    env = {"A_URL": MOTO, "ODD": "it's a $value; rm -rf /"}
    lines = export_lines(env)
    assert lines[0] == f"export A_URL={MOTO}"
    script = "\n".join([*lines, 'printf "%s\\n" "$A_URL" "$ODD"'])
    printed = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True)
    assert printed.stdout.splitlines() == [MOTO, env["ODD"]]
    assert shlex.split(lines[1]) == ["export", f"ODD={env['ODD']}"]
