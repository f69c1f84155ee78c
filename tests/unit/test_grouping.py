"""Natural order, identical rows grouped, and host names written as ranges: what keeps a 200-host view readable."""

from __future__ import annotations

from ddops.grouping import group_identical, host_ranges, natural_key, natural_sorted


def test_hosts_sort_naturally_host2_before_host10():
    names = ["host10", "host2", "host1", "gpu-b", "host02", "Host3", "gpu-a", "h200-a10", "h200-a9"]
    assert natural_sorted(names) == ["gpu-a", "gpu-b", "h200-a9", "h200-a10", "host1", "host2", "host02", "Host3",
                                     "host10"]


def test_natural_keys_never_compare_a_number_with_text():
    assert sorted(["a1", "1a", "a", "1", ""], key=natural_key) == ["", "1", "1a", "a", "a1"]


def test_identical_items_are_grouped_in_the_order_their_key_first_comes():
    rows = [("h1", "ok"), ("h2", "drift"), ("h3", "ok"), ("h4", "ok")]
    assert group_identical(rows, key=lambda r: r[1]) == [("ok", [("h1", "ok"), ("h3", "ok"), ("h4", "ok")]),
                                                         ("drift", [("h2", "drift")])]


def test_host_names_differing_in_one_number_are_written_as_ranges():
    names = [f"host{n}" for n in [3, 1, 2, 5, 10, 11, 12, 24]] + ["gpu-a", "bastion"]
    assert host_ranges(names) == "bastion, gpu-a, host[1-3,5,10-12,24]"


def test_zero_padding_suffixes_and_single_names_are_kept_as_written():
    assert host_ranges(["node01", "node02", "node03", "node07"]) == "node[01-03,07]"
    assert host_ranges(["gpu1.lab", "gpu2.lab", "gpu4"]) == "gpu[1-2].lab, gpu4"
    assert host_ranges(["10.1.2.3"]) == "10.1.2.3" and host_ranges([]) == ""


def test_a_playbooks_status_cell_is_its_patches_state_or_the_most_common_with_the_odd_ones_named():
    from ddops.cli.patch import _combined

    ids = ("crop-helper", "crop-relative", "crop-recording")
    assert _combined(dict.fromkeys(ids, "applied"), ids, "-") == ("applied", "")
    states = {"crop-helper": "applied", "crop-relative": "applied", "crop-recording": "pending"}
    assert _combined(states, ids, "-") == ("applied 2/3", "crop-recording pending")
    assert _combined({"crop-helper": "applied"}, ids, "not-applied") == (
        "not-applied 2/3", "crop-helper applied")


def test_a_table_fits_when_every_columns_longest_word_does():
    from ddops.grouping import columns_fit

    rows = [["host", "python", "transformers"], ["host1", "3.11.2", "5.24.0"]]
    assert columns_fit(rows, 80) and columns_fit(rows, 5 + 6 + 12 + 9 + 1)
    assert not columns_fit(rows, 5 + 6 + 12 + 9)  # one column short: `transformers` would be cut to `transfor…`


def test_a_groups_hosts_cell_keeps_its_count_on_one_line_and_says_all_when_it_is_all():
    from ddops.grouping import hosts_cell

    assert hosts_cell(["host1", "host2", "host7"]) == "host[1-2,7]\u00a0(3)"
    assert hosts_cell(["gpu-a"]) == "gpu-a"
    assert hosts_cell(["h1", "h2"], among=2) == "all 2 hosts" and hosts_cell(["h1"], among=1) == "h1"
