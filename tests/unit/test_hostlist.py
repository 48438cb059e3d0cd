import pytest

from corectl.hostlist import HostlistError, compress, expand, expand_addresses


def test_expand_ranges_and_lists():
    assert expand("dgx[01-03]") == ["dgx01", "dgx02", "dgx03"]
    assert expand("dgx[08-10,12],head01") == ["dgx08", "dgx09", "dgx10", "dgx12", "head01"]
    assert expand("n[9-11]") == ["n9", "n10", "n11"]


@pytest.mark.parametrize("bad", ["dgx[03-01]", "dgx[01-", "dgx[a-b]", "a[1-2]b[1-2]", ""])
def test_expand_rejects_malformed(bad):
    with pytest.raises(HostlistError):
        expand(bad)


def test_addresses_from_start_or_range():
    assert expand_addresses("10.0.0.254", 3) == ["10.0.0.254", "10.0.0.255", "10.0.1.0"]
    assert expand_addresses("10.0.1.[11-12]", 2) == ["10.0.1.11", "10.0.1.12"]
    with pytest.raises(HostlistError):
        expand_addresses("10.0.1.[11-12]", 3)
    with pytest.raises(HostlistError):
        expand_addresses("not-an-ip", 1)


def test_compress_round_trips():
    names = expand("dgx[01-06,09],head01")
    assert compress(names) == "dgx[01-06,09],head01"
    assert expand(compress(names)) == sorted(names)


def test_compress_keeps_zero_padding_and_several_prefixes():
    assert compress(["dgx003", "dgx001", "dgx002", "dgx010"]) == "dgx[001-003,010]"
    assert compress(["gpu-b-01", "gpu-a-02", "gpu-a-01", "head01", "gpu-a-03"]) == "gpu-a-[01-03],gpu-b-01,head01"
    assert compress(["n9", "n10", "n11", "login"]) == "login,n9,n[10-11]"
    assert compress(["dgx01", "dgx01", "dgx02"]) == "dgx[01-02]"
    for names in (["dgx009", "dgx100", "dgx1000"], ["n9", "n10", "n11"], ["a01", "b001", "a1"]):
        assert sorted(expand(compress(names))) == sorted(names)


def test_compress_a_thousand_nodes_with_gaps():
    names = [f"dgx{i:04d}" for i in range(1, 1001) if i not in (7, 250, 251, 512)]
    assert compress(names) == "dgx[0001-0006,0008-0249,0252-0511,0513-1000]"
    assert expand(compress(names)) == names
