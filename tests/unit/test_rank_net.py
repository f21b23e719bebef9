"""A rank's choice of the collectives' interface (procs/rank_net.py) and what %ddp_env says of it (checks_live.py).
The choice on real hosts, both styles of /etc/hosts: tests/cluster/."""
from __future__ import annotations

from ddp_magic.plan.checks_live import check_interfaces
from ddp_magic.procs import rank_net


def test_one_host_is_left_as_it_was():
    for master in ("127.0.0.1", "::1", "localhost", ""):
        env = {"MASTER_ADDR": master}
        assert rank_net.choose(env) == "" and env == {"MASTER_ADDR": master}


def test_iface_is_set_for_both_backends_and_the_users_own_wins():
    env = {"MASTER_ADDR": "198.51.100.11", rank_net.IFACE_ENV: "fast0"}
    assert rank_net.choose(env) == "fast0, --iface"
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "fast0"
    env = {"MASTER_ADDR": "198.51.100.11", rank_net.IFACE_ENV: "fast0", "GLOO_SOCKET_IFNAME": "ib0"}
    assert rank_net.choose(env) == "fast0, --iface; the user's GLOO_SOCKET_IFNAME=ib0 kept"
    assert env["GLOO_SOCKET_IFNAME"] == "ib0" and env["NCCL_SOCKET_IFNAME"] == "fast0"
    assert env[rank_net.REPORT_ENV].startswith("fast0, --iface")


def test_the_interface_that_holds_an_address():
    assert rank_net.interface_of("127.0.0.1") == "lo"
    assert rank_net.interface_of("203.0.113.254") is None
    assert rank_net.loopback("127.0.1.1") and not rank_net.loopback("198.51.100.10")


def test_ddp_env_names_each_hosts_choice_and_warns_of_a_loopback_name():
    live = {
        0: {"net": {"host": "n1", "iface": "mgmt0", "how": "mgmt0, on the route to MASTER_ADDR 10.0.0.1", "name_resolves_to": "127.0.1.1"}},
        1: {"net": {"host": "n1", "iface": "mgmt0", "how": "mgmt0, on the route to MASTER_ADDR 10.0.0.1", "name_resolves_to": "127.0.1.1"}},
        2: {"net": {"host": "n2", "iface": "mgmt0", "how": "mgmt0, on the route to MASTER_ADDR 10.0.0.1", "name_resolves_to": "10.0.0.2"}},
    }
    info, warning = check_interfaces(live)
    assert info.ok and info.detail == ("n1: mgmt0, on the route to MASTER_ADDR 10.0.0.1; n2: mgmt0, on the route to MASTER_ADDR 10.0.0.1")
    assert warning.level == "warning" and warning.detail == (
        "n1's own name resolves to 127.0.1.1 (loopback: a `127.0.1.1 n1` line in its /etc/hosts, as Debian and Ubuntu install it); "
        "GLOO_SOCKET_IFNAME=mgmt0 was set there, so gloo does not bind it")
    assert check_interfaces({0: {"net": {"host": "h", "how": None}}}) == [], "one host: nothing to say"
