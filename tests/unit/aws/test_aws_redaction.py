"""Credentials are masked in every text that goes through redact()."""

from __future__ import annotations

from shardflow.aws import redact, register_secret
from shardflow.aws.redaction import MASK


def test_registered_secrets_are_masked_wherever_they_appear() -> None:
    secret = "redaction-Secret-Key-AAAA1111BBBB2222"
    token = "redaction-session-token-CCCC3333DDDD4444"
    register_secret(secret, token, None)
    text = redact(f"secret={secret}; token={token}; again {secret}")
    assert secret not in text
    assert token not in text
    assert text == f"secret={MASK}; token={MASK}; again {MASK}"


def test_a_longer_secret_containing_a_shorter_one_is_masked_whole() -> None:
    short = "overlap-1234567"
    long = short + "-and-more-9876"
    register_secret(short, long)
    assert redact(f"[{long}]") == f"[{MASK}]"


def test_short_values_are_not_registered() -> None:
    # Masking "abc" would mangle innocent text; real secrets are long.
    register_secret("abc1234")
    assert redact("abc1234 stays") == "abc1234 stays"


def test_access_key_ids_are_masked_even_if_unregistered() -> None:
    for key_id in ("AKIAIOSFODNN7EXAMPLE", "ASIAQWERTYUIOPASDFGH"):
        text = redact(f"key {key_id} was used")
        assert key_id not in text
        assert text == f"key {MASK} was used"


def test_signatures_and_credential_scopes_are_masked() -> None:
    header = (
        "AWS4-HMAC-SHA256 Credential=shardflow-user/20240101/us-east-1/kinesis/aws4_request, "
        "SignedHeaders=host;x-amz-date, Signature=" + "ab12" * 16
    )
    text = redact(header)
    assert "shardflow-user" not in text
    assert "ab12" * 16 not in text
    assert f"Credential={MASK}/20240101" in text
    assert f"Signature={MASK}" in text


def test_innocent_text_is_unchanged() -> None:
    text = "Stream orders under account 123456789012 not found."
    assert redact(text) == text
