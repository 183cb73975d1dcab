"""One cache folder for the whole test run: a kernel compiled (or a plan built) by one test
is read from disk by the next, and nothing lands in the user's ~/.cache/dashgen."""
from __future__ import annotations

import pytest

from dashgen.caches import CACHE_ENV


@pytest.fixture(scope="session", autouse=True)
def shared_cache_dir(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        path = tmp_path_factory.mktemp("dashgen-cache")
        patch.setenv(CACHE_ENV, str(path))
        yield path
