"""A build's long library of kernels compiles as two halves at once (codegen/library.py)."""

from types import SimpleNamespace

from dynshape.codegen import library


def _kernels(sizes: list[int]) -> tuple[list, dict[str, str]]:
    ks = [SimpleNamespace(kernel=SimpleNamespace(name=f"k{i}")) for i in range(len(sizes))]
    return ks, {f"k{i}": "x" * n for i, n in enumerate(sizes)}


def test_a_short_library_stays_whole():
    ks, src = _kernels([100, 200, 300])
    assert library._halves(ks, src) == [ks]


def test_a_long_library_splits_into_balanced_halves_in_build_order():
    sizes = [5000, 300, 2900, 2800, 100, 2000]
    ks, src = _kernels(sizes)
    halves = library._halves(ks, src)
    assert len(halves) == 2 and all(halves)
    names = [k.kernel.name for h in halves for k in h]
    assert sorted(names) == sorted(src)  # every kernel exactly once
    for h in halves:  # each half keeps the order of the build
        assert [k.kernel.name for k in h] == [k.kernel.name for k in ks if k in h]
    loads = [sum(len(src[k.kernel.name]) for k in h) for h in halves]
    assert abs(loads[0] - loads[1]) <= max(sizes)
    assert max(loads) <= sum(sizes) * 0.6
