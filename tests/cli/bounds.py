"""Resource bounds the hostile-input tests assert, scaled for the sanitizer build: ASan's
shadow memory and quarantine add to a run's peak RSS, and it runs several times slower. ctest
says which build the tests run on (FRAGSCOPE_SANITIZED=1 for the asan-ubsan preset, from
tests/cli/tests.cmake). The scaled bounds still catch what they are for: growth without end
reaches gigabytes and runs into the timeout either way."""
import os

SANITIZED = os.environ.get("FRAGSCOPE_SANITIZED") == "1"


def rss(limit_bytes):
    """A peak-RSS bound: the plain build's, or twice it plus 256 MiB under the sanitizers."""
    return limit_bytes * 2 + (256 << 20) if SANITIZED else limit_bytes


def seconds(limit):
    """A time bound: the plain build's, or six times it under the sanitizers."""
    return limit * 6 if SANITIZED else limit
