"""The properties file as java.util.Properties.load reads it, and as the KCL's keys mean it."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardflow.fetch import FanOut, Polling
from shardflow.multilang import PropertiesError, config_from, parse_properties
from shardflow.positions import PositionKind

BASE = "executableName = python3 app.py\nstreamName = orders\napplicationName = billing\n"


def values(text: str) -> dict[str, str]:
    return {p.key: p.value for p in parse_properties(text)}


def test_separators_comments_and_blanks_as_java_reads_them() -> None:
    text = "# comment\n! also a comment\n   \na = 1\nb:2\nc 3\nd\t=\t  4  \ne\nf = = 6\n  g=7\n"
    assert values(text) == {
        "a": "1",
        "b": "2",
        "c": "3",
        "d": "4  ",  # trailing blanks are kept, leading dropped
        "e": "",
        "f": "= 6",
        "g": "7",
    }


def test_continuations_escapes_and_the_last_occurrence_wins() -> None:
    text = (
        "cmd = python3 \\\n"
        "      app.py \\\n"
        "      --flag\n"
        "path = C:\\\\dir\\\\x\n"
        "tab = a\\tb\\nc\n"
        "uni = caf\\u00e9\n"
        "key\\ with\\ space = v\n"
        "k\\=eq = w\n"
        "dup = first\n"
        "dup = second\n"
        "even = ends\\\\\n"
        "next = n\n"
    )
    got = values(text)
    assert got["cmd"] == "python3 app.py --flag"
    assert got["path"] == "C:\\dir\\x"
    assert got["tab"] == "a\tb\nc"
    assert got["uni"] == "café"
    assert got["key with space"] == "v"
    assert got["k=eq"] == "w"
    assert got["dup"] == "second"
    assert got["even"] == "ends\\"  # an even number of backslashes does not continue
    assert got["next"] == "n"


def test_line_numbers_point_at_the_start_of_the_logical_line() -> None:
    props = parse_properties("# c\na = 1 \\\n  2\n\nb = 3\r\nc = 4\rd = 5")
    assert [(p.key, p.line) for p in props] == [("a", 2), ("b", 5), ("c", 6), ("d", 7)]


def test_a_broken_unicode_escape_is_the_one_syntax_error() -> None:
    with pytest.raises(PropertiesError, match="line 2"):
        parse_properties("a = 1\nb = \\u12x4\n")


_KEY = st.text(st.characters(codec="latin-1", exclude_characters="\r\n"), min_size=1, max_size=20)
_VALUE = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=40)


def _escape(text: str, *, key: bool) -> str:
    out = []
    for index, char in enumerate(text):
        if char in "\\=:#!" or (char in " \t\f" and (key or index == 0)):
            out.append("\\" + char)
        elif char == "\n":
            out.append("\\n")
        elif char == "\r":
            out.append("\\r")
        elif ord(char) > 0xFF:
            out.append(f"\\u{ord(char):04x}" if ord(char) <= 0xFFFF else char)
        else:
            out.append(char)
    return "".join(out)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(_KEY, _VALUE.filter(lambda v: all(ord(c) <= 0xFFFF for c in v))))
def test_what_java_would_write_reads_back(pairs: dict[str, str]) -> None:
    text = "".join(f"{_escape(k, key=True)} = {_escape(v, key=False)}\n" for k, v in pairs.items())
    assert values(text) == pairs


# --- the KCL's keys --------------------------------------------------------------------------------


def config(text: str):  # type: ignore[no-untyped-def]
    return config_from(parse_properties(text))


def test_the_kclpy_sample_file_runs_with_nothing_unhonoured() -> None:
    sample = (
        "executableName = sample_kclpy_app.py\n"
        "streamArn = arn:aws:kinesis:us-east-5:000000000000:stream/kclpysample\n"
        "streamName = kclpysample\n"
        "applicationName = PythonKCLSample\n"
        "AwsCredentialsProvider = DefaultCredentialsProvider\n"
        "processingLanguage = python/3.8\n"
        "initialPositionInStream = TRIM_HORIZON\n"
        "regionName = us-east-1\n"
    )
    got = config(sample)
    assert got.command == ("sample_kclpy_app.py",)
    assert got.stream == "kclpysample"
    assert got.application == got.table_name == "PythonKCLSample"
    assert got.region == "us-east-1"
    assert got.initial_position.kind is PositionKind.TRIM_HORIZON
    assert got.retrieval == "FANOUT"  # the KCL's default with no polling property set
    assert isinstance(got.consumer_settings().fetch, FanOut)
    assert got.notes == ()


def test_polling_settings_and_lease_timing_map_to_the_consumer() -> None:
    got = config(
        BASE + "maxRecords = 500\nidleTimeBetweenReadsInMillis = 250\nfailoverTimeMillis = 3000\n"
        "shutdownGraceMillis = 5000\ntimeoutInSeconds = 7\nworkerId = w1\n"
        "kinesisEndpoint = http://127.0.0.1:4567\ndynamoDBEndpoint = localhost:8000\n"
        "maxLeasesForWorker = 4\nmaxLeasesToStealAtOneTime = 2\ntableName = leases\n"
        "cleanupLeasesUponShardCompletion = false\ncallProcessRecordsEvenForEmptyRecordList = on\n"
    )
    settings = got.consumer_settings()
    assert got.retrieval == "POLLING"
    assert isinstance(settings.fetch, Polling)
    assert (settings.fetch.max_records, settings.fetch.idle_time) == (500, 0.25)
    assert settings.leases.failover_time == 3.0
    assert settings.leases.max_leases_per_worker == 4
    assert settings.leases.max_leases_to_steal_at_once == 2
    assert settings.leases.cleanup_finished_leases is False
    assert settings.drain_timeout == 5.0
    assert settings.worker_id == "w1"
    assert settings.checkpoint.every_n is None
    assert settings.checkpoint.interval is None
    assert got.response_timeout == 7.0
    assert got.empty_batches is True
    assert got.table_name == "leases"
    assert got.kinesis_endpoint == "http://127.0.0.1:4567"
    assert got.dynamodb_endpoint == "https://localhost:8000"  # a KCL 1.x host name


def test_kcl_defaults_where_the_file_says_nothing() -> None:
    got = config(BASE + "retrievalMode = polling\n")
    settings = got.consumer_settings()
    assert isinstance(settings.fetch, Polling)
    assert settings.fetch.max_records == 10_000
    assert settings.fetch.idle_time == 1.5
    assert settings.leases.failover_time == 10.0
    assert got.initial_position.kind is PositionKind.LATEST
    assert got.shutdown_grace == 30.0  # the KCL's 0 would not stop gracefully at all


def test_at_timestamp_takes_epoch_seconds_from_the_extended_key() -> None:
    got = config(
        BASE
        + "initialPositionInStream = AT_TIMESTAMP\ninitialPositionInStreamExtended = 1636609142\n"
    )
    assert got.initial_position.kind is PositionKind.AT_TIMESTAMP
    assert got.initial_position.timestamp == datetime.fromtimestamp(1636609142, UTC)
    with pytest.raises(PropertiesError, match="initialPositionInStreamExtended"):
        config(BASE + "initialPositionInStream = AT_TIMESTAMP\n")
    with pytest.raises(PropertiesError, match="conflicts"):
        config(BASE + "initialPositionInStream = LATEST\ninitialPositionInStreamExtended = 5\n")


def test_unknown_and_unhonoured_keys_are_named_with_their_line() -> None:
    got = config(
        BASE
        + "metricsBufferTimeMillis = 1000\nmaxActiveThreads = 4\nstreamNmae = typo\n"
        + "fanoutConfig.consumerArn = arn:aws:kinesis:us-east-1:1:stream/s/consumer/c:1\n"
        + "workerMetricsTableName = x\n"
    )
    notes = {note.key: note for note in got.notes}
    assert notes["metricsBufferTimeMillis"].kind == "no effect"  # no metricsLevel: no metrics
    assert notes["maxActiveThreads"].kind == "no effect"
    assert notes["streamNmae"].kind == "unknown"
    assert notes["streamNmae"].line == 6
    assert notes["fanoutConfig.consumerArn"].kind == "differs"
    assert notes["workerMetricsTableName"].kind == "no effect"
    assert "streamNmae (line 6): unknown" in str(notes["streamNmae"])


def test_the_metrics_keys_ask_for_cloudwatch_under_the_kcls_names() -> None:
    assert config(BASE).metrics is None  # unset: nothing is published (the KCL: DETAILED)
    assert config(BASE + "metricsLevel = NONE\n").metrics is None
    got = config(
        BASE
        + "metricsLevel = summary\nmetricsBufferTimeMillis = 10000\n"
        + "metricsMaxQueueSize = 500\nmetricsEnabledDimensions = Operation|ShardId\n"
    )
    assert got.notes == ()
    assert got.metrics is not None
    assert got.metrics.level == "SUMMARY"
    assert got.metrics.interval == 10.0
    assert got.metrics.max_datums == 500
    assert got.metrics.dimensions == frozenset({"Operation", "ShardId"})
    assert got.consumer_settings().metrics == got.metrics
    with pytest.raises(PropertiesError, match="unknown dimensions"):
        config(BASE + "metricsLevel = DETAILED\nmetricsEnabledDimensions = Shard\n")


def test_credentials_providers_the_standard_chain_covers_and_those_it_does_not() -> None:
    for chain in ("DefaultCredentialsProvider", "DefaultAWSCredentialsProviderChain"):
        for key in ("AwsCredentialsProvider", "AWSCredentialsProvider", "awscredentialsprovider"):
            assert config(BASE + f"{key} = {chain}\n").notes == ()
    assert (
        config(BASE + "AwsCredentialsProvider = ProfileCredentialsProvider|ops\n").profile == "ops"
    )
    with pytest.raises(PropertiesError, match="StsAssumeRoleCredentialsProvider"):
        config(BASE + "AwsCredentialsProvider = StsAssumeRoleCredentialsProvider|arn:x|s\n")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("streamName = s\napplicationName = a\n", "executableName"),
        ("executableName = x\nstreamName = s\n", "applicationName"),
        ("executableName = x\napplicationName = a\n", "streamName"),
        (BASE + "failoverTimeMillis = ten\n", "failoverTimeMillis"),
        (BASE + "retrievalMode = PUSH\n", "retrievalMode"),
        (BASE + "streamArn = not-an-arn\n", "streamArn"),
        (BASE + "cleanupLeasesUponShardCompletion = maybe\n", "cleanupLeasesUponShardCompletion"),
    ],
)
def test_what_the_kcl_refuses_is_refused_by_name(text: str, message: str) -> None:
    with pytest.raises(PropertiesError, match=message):
        config(text)


def test_the_command_line_is_split_on_spaces_as_the_kcl_splits_it() -> None:
    assert config(BASE.replace("python3 app.py", "node  proc.js   --x ")).command == (
        "node",
        "proc.js",
        "--x",
    )
