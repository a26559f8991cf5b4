"""Issue 12 item 7: Tessera's recovery on a plain Ray cluster, through the documented API only."""

from __future__ import annotations

import pytest

from raybridge.plain import train

pytestmark = pytest.mark.ray

CONFIG = {"global_batch": 24, "channels": 8, "blocks": 1, "image_size": 8, "lr": 0.05}


def test_train_on_a_plain_ray_cluster_with_a_node_killed(ray_nodes):
    nodes = ray_nodes.add(2)
    killed = []

    def on_step(report):
        if report.step == 3 and not killed:  # a node dies mid-training: the job shrinks and goes on
            killed.append(nodes[0])
            ray_nodes.cluster.kill(nodes[0])

    history = train(None, "raybridge.examples.resnet:build", {**CONFIG, "steps": 12}, world=2, job="plain/test",
                    on_step=on_step, nodes=nodes)
    assert sorted(history.losses) == list(range(1, 13)), "every step exactly once"
    assert killed and len(history.recoveries) == 1 and history.recoveries[0].redone <= 1


def test_too_few_nodes_is_said_in_words(ray_nodes):
    with pytest.raises(ValueError, match="nodes advertising tessera-node"):
        train(None, "raybridge.examples.resnet:build", {**CONFIG, "steps": 1}, world=10_000)
