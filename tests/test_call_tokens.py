"""Call tokens, origin matching, API keys and rate limits, without a server."""

import base64
import json

import pytest

from gateway import call_tokens, tokens
from gateway.api_keys import ApiKeyError, ApiKeys, digest, read_digest_file
from gateway.call_tokens import CallTokenError, OriginError, normalize_origin, origin_in
from gateway.config import Config, ConfigError
from gateway.rate_limit import RateLimiter

SECRET = "s3cret-for-tests"
SHOP = "https://shop.example"
NOW = 1_700_000_000.0


def test_a_token_round_trips_its_origins_expiry_and_flow():
    token, expires_at = call_tokens.issue(["https://Shop.Example:443", "http://127.0.0.1:8000"], 300, SECRET,
                                          flow="orders", now=NOW)
    assert expires_at == NOW + 300
    grant = call_tokens.verify(token, SECRET, now=NOW + 299)
    assert grant.origins == ("http://127.0.0.1:8000", "https://shop.example")
    assert grant.flow == "orders" and grant.expires_at == expires_at
    assert grant.allows_origin("https://shop.example") and grant.allows_origin("http://127.0.0.1:8000")


def test_each_token_has_its_own_id():
    first, _ = call_tokens.issue([SHOP], 60, SECRET, now=NOW)
    second, _ = call_tokens.issue([SHOP], 60, SECRET, now=NOW)
    assert call_tokens.verify(first, SECRET, now=NOW).token_id != call_tokens.verify(second, SECRET, now=NOW).token_id


def test_expiry():
    token, expires_at = call_tokens.issue([SHOP], 60, SECRET, now=NOW)
    call_tokens.verify(token, SECRET, now=expires_at - 1)
    for later in (expires_at, expires_at + 3600):
        with pytest.raises(CallTokenError) as refused:
            call_tokens.verify(token, SECRET, now=later)
        assert refused.value.code == "token_expired"


def test_forged_and_tampered_tokens_are_refused():
    token, _ = call_tokens.issue([SHOP], 60, SECRET, now=NOW)
    prefix, payload, signature = token.split(".")
    body = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    body["o"] = ["https://evil.example"]
    widened = base64.urlsafe_b64encode(json.dumps(body).encode()).rstrip(b"=").decode()
    forged_elsewhere, _ = call_tokens.issue([SHOP], 60, "another gateway's secret", now=NOW)
    resume_token = tokens.issue("session-1", SECRET, 60, now=NOW)  # same secret, other kind of token
    for bad in (f"{prefix}.{widened}.{signature}", forged_elsewhere, resume_token, token[:-2], token + "x",
                "", "pct1..", "pct1.e30.", None, 42, "x" * 5000):
        with pytest.raises(CallTokenError) as refused:
            call_tokens.verify(bad, SECRET, now=NOW)
        assert refused.value.code == "invalid_token", bad


def test_a_call_token_is_no_resume_token():
    token, _ = call_tokens.issue([SHOP], 60, SECRET, now=NOW)
    with pytest.raises(tokens.TokenError):
        tokens.verify(token, SECRET, now=NOW)


@pytest.mark.parametrize("written, canonical", [
    ("https://shop.example", "https://shop.example"),
    ("HTTPS://Shop.EXAMPLE", "https://shop.example"),
    ("https://shop.example:443", "https://shop.example"),
    ("http://shop.example:80", "http://shop.example"),
    ("https://shop.example:8443", "https://shop.example:8443"),
    ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
    ("http://[::1]:8000", "http://[::1]:8000"),
])
def test_origins_are_normalized(written, canonical):
    assert normalize_origin(written) == canonical


@pytest.mark.parametrize("bad", [
    "shop.example", "https://", "https://shop.example/", "https://shop.example/path", "https://shop.example?x",
    "https://*.shop.example", "*", "https://user@shop.example", "ftp://shop.example", "https://shop.example.",
    "https://shop.example:99999", "https://shop .example", "null", "", "x" * 400,
])
def test_malformed_origins_are_refused(bad):
    with pytest.raises(OriginError):
        normalize_origin(bad)


def test_origin_matching_is_exact_scheme_host_and_port():
    allowed = [normalize_origin(SHOP)]
    assert origin_in("https://shop.example", allowed)
    assert origin_in("https://shop.example:443", allowed)  # the same origin, written out
    for other in ("http://shop.example",  # scheme
                  "https://shop.example:8443",  # port
                  "https://evil-shop.example", "https://shop.example.evil.example",  # suffix and prefix tricks
                  "https://evilshop.example", "https://www.shop.example", "https://example",
                  "https://shop.example@evil.example", "null", "", None):
        assert not origin_in(other, allowed), other


def test_issue_refuses_bad_origins_and_flows():
    with pytest.raises(OriginError):
        call_tokens.issue([], 60, SECRET)
    with pytest.raises(OriginError):
        call_tokens.issue(["https://*.example"], 60, SECRET)
    with pytest.raises(ValueError):
        call_tokens.issue([SHOP], 60, SECRET, flow="../etc/passwd")


def test_api_keys_from_the_environment_and_a_file_of_digests(tmp_path):
    plain, hashed = "k" * 32, "another-key-0123456789"
    keys_file = tmp_path / "keys.txt"
    keys_file.write_text(f"# the shop\n{digest(hashed)}\n\n{digest('third-key-abcdefghij').upper()}  # upper case too\n")
    keys = ApiKeys([plain], str(keys_file))
    assert keys.configured and len(keys) == 3
    assert keys.accepts(plain) and keys.accepts(hashed) and keys.accepts("third-key-abcdefghij")
    assert not keys.accepts(digest(hashed))  # the digest itself is not the key
    assert not keys.accepts("k" * 31) and not keys.accepts("")
    assert not ApiKeys().configured


def test_bad_api_keys_and_key_files_are_refused(tmp_path):
    with pytest.raises(ApiKeyError, match="at least 16"):
        ApiKeys(["short"])
    bad = tmp_path / "keys.txt"
    bad.write_text(f"{digest('x' * 20)}\nnot-a-digest\n")
    with pytest.raises(ApiKeyError, match="line 2"):
        read_digest_file(str(bad))
    with pytest.raises(ApiKeyError, match="cannot read"):
        read_digest_file(str(tmp_path / "missing.txt"))


def test_config_validates_the_access_settings(tmp_path):
    cases = [({"api_keys": ["short"]}, "api_keys"), ({"api_keys_file": str(tmp_path / "none")}, "api_keys_file"),
             ({"allowed_origins": ["https://shop.example/"]}, "allowed_origins"),
             ({"call_token_max_ttl_s": 0}, "call_token_max_ttl_s"), ({"rate_limit_per_ip": -1}, "rate_limit_per_ip")]
    for settings, name in cases:
        with pytest.raises(ConfigError, match=name):
            Config(**settings).validate()
    config = Config(api_keys=["k" * 20], allowed_origins=[SHOP]).validate()
    assert config.masked()["api_keys"] == "***"


def test_config_reads_keys_and_origins_from_the_environment():
    from gateway.config import load

    config = load(environ={"PARLEY_API_KEYS": "first-key-0123456789, second-key-0123456789",
                           "PARLEY_ALLOWED_ORIGINS": "https://shop.example,http://127.0.0.1:8000"})
    assert config.api_keys == ["first-key-0123456789", "second-key-0123456789"]
    assert config.allowed_origins == ["https://shop.example", "http://127.0.0.1:8000"]


def test_rate_limiter_allows_its_rate_then_says_when():
    now = [0.0]
    limiter = RateLimiter(per_minute=6, clock=lambda: now[0])  # one every 10 s, six at once
    assert [limiter.take("a") for _ in range(6)] == [0.0] * 6
    assert limiter.take("a") == pytest.approx(10.0)
    assert limiter.take("b") == 0.0  # keys are counted apart
    now[0] = 5.0
    assert limiter.take("a") == pytest.approx(5.0)
    now[0] = 10.0
    assert limiter.take("a") == 0.0 and limiter.take("a") > 0
    assert all(RateLimiter(per_minute=0).take("a") == 0.0 for _ in range(100))  # 0: no limit
