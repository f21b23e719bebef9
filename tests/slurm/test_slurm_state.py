"""The one-host Slurm keeps its own state, spool, pid and log paths: a Slurm that ran on this machine before under
another cluster name (its ``clustername`` in Debian's /var/lib/slurm/slurmctld) does not stop ours with
``fatal: CLUSTER NAME MISMATCH``; nor does a stale one in our own folder."""
from __future__ import annotations

import os
import re

import slurm_fixtures

local_slurm = slurm_fixtures.local_slurm  # scripts/ is on the path once slurm_fixtures is imported
slurm_cluster = slurm_fixtures.slurm_cluster  # the fixture, by name in this module

DEBIAN_STATE = "/var/lib/slurm/slurmctld"  # the packaged default StateSaveLocation: anyone's


def test_every_path_of_the_conf_is_ours(slurm_cluster: str) -> None:
    conf = open(local_slurm.CONF).read()
    paths = re.findall(r"^(?:StateSaveLocation|SlurmdSpoolDir|Slurm\w*PidFile|Slurm\w*LogFile)=(\S+)$", conf, re.M)
    assert len(paths) == 6, conf
    for path in paths:
        assert path.startswith((local_slurm.STATE, local_slurm.RUN, local_slurm.LOGS)), path
    with open(os.path.join(local_slurm.STATE, "slurmctld", "clustername")) as f:
        assert f.read().strip() == "ddpmagic"


def test_a_stale_clustername_elsewhere_or_in_ours_does_not_matter(slurm_cluster: str) -> None:
    planted = os.path.join(DEBIAN_STATE, "clustername")
    before = open(planted).read() if os.path.exists(planted) else None
    os.makedirs(DEBIAN_STATE, exist_ok=True)
    try:
        with open(planted, "w") as f:
            f.write("someoneelse\n")  # a Slurm that ran here before
        local_slurm.stop()
        with open(os.path.join(local_slurm.STATE, "slurmctld", "clustername"), "w") as f:
            f.write("renamed\n")  # ours, from a conf with another ClusterName
        assert local_slurm.start().startswith("local Slurm up")
        assert sorted(local_slurm.idle_nodes()) == list(local_slurm.NODES)
    finally:
        if before is None:
            os.remove(planted)
        else:
            with open(planted, "w") as f:
                f.write(before)
        local_slurm.start()
