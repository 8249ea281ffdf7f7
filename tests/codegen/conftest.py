"""Every codegen test builds into a private disk cache, never the user's ~/.cache/dynshape."""

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    # Session scope: it must be in place before module-scoped fixtures compile anything.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DYNSHAPE_CACHE_DIR", str(tmp_path_factory.mktemp("dynshape-cache")))
        yield
