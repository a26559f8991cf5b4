"""The device plugin over real gRPC on unix sockets: a stand-in kubelet's Registration server records what the
plugin registers, and the test calls the plugin as the kubelet 1.20 does (ListAndWatch, GetPreferredAllocation,
Allocate). The real kubelet runs it in tests/e2e/test_nodes_e2e.py."""

from __future__ import annotations

import json
import threading
from concurrent import futures

import grpc
import pytest

from gpu_sharing.deviceplugin import api
from gpu_sharing.deviceplugin.plugin import GpuPlugin, Refused
from gpu_sharing.deviceplugin.podresources import KubeletPods
from gpu_sharing.deviceplugin.server import ENDPOINTS, KUBELET_SOCKET, PluginServer
from gpu_sharing.devices import GpuDevice
from tessera_contract import ASSIGNMENT_ANNOTATION, GPU_RESOURCE, MAC_ANNOTATION, MILLI_RESOURCE
from tessera_contract.keyring import AssignmentSigner

KEY = b"k" * 32
ENDPOINT = ENDPOINTS[GPU_RESOURCE]
NODE = "gpu-1"
GPUS = tuple(GpuDevice(i, f"GPU-{NODE}-{i}", "T4", 15360) for i in range(4))


def test_messages_encode_as_the_protobuf_wire_format_fixes():
    """Field numbers and types are the API's: RegisterRequest{version=1, endpoint=2, resource_name=3, options=4{
    get_preferred_allocation_available=2}}, written out byte by byte from the wire format (tag = number << 3 | type)."""
    want = (b"\x0a\x07v1beta1" + b"\x12\x10tessera-gpu.sock" + b"\x1a\x0envidia.com/gpu" + b"\x22\x02\x10\x01")
    got = api.RegisterRequest(version="v1beta1", endpoint="tessera-gpu.sock", resource_name="nvidia.com/gpu",
                              options=api.DevicePluginOptions(get_preferred_allocation_available=True))
    assert got.SerializeToString() == want
    # ContainerAllocateResponse{envs=1 (map entry {key=1, value=2}), devices=3 {container_path=1, host_path=2, permissions=3}}
    r = api.ContainerAllocateResponse()
    r.envs["A"] = "b"
    r.devices.add(container_path="/c", host_path="/h", permissions="rw")
    assert r.SerializeToString() == b"\x0a\x06\x0a\x01A\x12\x01b" + b"\x1a\x0c\x0a\x02/c\x12\x02/h\x1a\x02rw"
    # Device{ID=1, health=2}, ContainerPreferredAllocationRequest{available=1, must_include=2, allocation_size=3}
    assert api.Device(ID="x", health="Healthy").SerializeToString() == b"\x0a\x01x\x12\x07Healthy"
    req = api.M["ContainerPreferredAllocationRequest"](available_deviceIDs=["a"], must_include_deviceIDs=["b"], allocation_size=2)
    assert req.SerializeToString() == b"\x0a\x01a\x12\x01b\x18\x02"


def pod(name: str, gpus: list[int], created: str, *, node: str = NODE, mac: str | None = None, phase: str = "Pending",
        uid: str = "", milli: int = 1000, uuids: list[str] | None = None) -> dict:
    """A pod bound to `node` as Tessera's bind leaves it: the assignment, its MAC, and the containers' request."""
    uid = uid or f"uid-{name}"
    uuids = [f"GPU-{node}-{g}" for g in gpus] if uuids is None else uuids
    body = json.dumps({"node": node, "gpus": gpus, "milli": milli, "uuids": uuids})
    ann = {ASSIGNMENT_ANNOTATION: body, MAC_ANNOTATION: AssignmentSigner(KEY).mac(uid, body) if mac is None else mac}
    limits = {GPU_RESOURCE: str(len(gpus))} if milli == 1000 else {MILLI_RESOURCE: str(milli)}
    return {"metadata": {"namespace": "t", "name": name, "uid": uid, "creationTimestamp": created, "annotations": ann},
            "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"limits": limits}}]},
            "status": {"phase": phase}}


class Kubelet:
    """The kubelet's side: a Registration server on kubelet.sock that records each Register, and a client of
    the plugin's socket."""

    def __init__(self, tmp_path) -> None:
        self.dir, self.registered = tmp_path, []
        self.server = self._serve()

    def _serve(self):
        def register(request, context):
            self.registered.append(request)
            return api.Empty()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(api.REGISTRATION_SERVICE, {
            "Register": grpc.unary_unary_rpc_method_handler(register, request_deserializer=api.RegisterRequest.FromString,
                                                            response_serializer=api.Empty.SerializeToString)}),))
        server.add_insecure_port(f"unix://{self.dir / KUBELET_SOCKET}")
        server.start()
        return server

    def restart(self) -> None:
        """As a kubelet that starts does: every socket in the directory removed, a new kubelet.sock."""
        self.server.stop(0).wait()
        for f in self.dir.iterdir():
            if f.suffix == ".sock":
                f.unlink()
        self.server = self._serve()

    def call(self, method: str, request, response):
        with grpc.insecure_channel(f"unix://{self.dir / ENDPOINT}") as ch:
            return ch.unary_unary(f"/{api.PLUGIN_SERVICE}/{method}", request_serializer=type(request).SerializeToString,
                                  response_deserializer=response.FromString)(request, timeout=5)

    def devices(self) -> list[tuple[str, str]]:
        with grpc.insecure_channel(f"unix://{self.dir / ENDPOINT}") as ch:
            stream = ch.unary_stream(f"/{api.PLUGIN_SERVICE}/ListAndWatch", request_serializer=api.Empty.SerializeToString,
                                     response_deserializer=api.ListAndWatchResponse.FromString)(api.Empty(), timeout=5)
            first = next(stream)
            stream.cancel()
        return [(d.ID, d.health) for d in first.devices]

    def preferred(self, available: list[str], size: int) -> list[str]:
        req = api.PreferredAllocationRequest()
        req.container_requests.add(available_deviceIDs=available, allocation_size=size)
        return list(self.call("GetPreferredAllocation", req, api.PreferredAllocationResponse).container_responses[0].deviceIDs)

    def allocate(self, ids: list[str]):
        req = api.AllocateRequest()
        req.container_requests.add(devicesIDs=ids)
        return self.call("Allocate", req, api.AllocateResponse).container_responses[0]


@pytest.fixture
def running(tmp_path):
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "nvidiactl").touch()
    sockets = tmp_path / "dp"
    sockets.mkdir()
    kubelet = Kubelet(sockets)
    pods: list[dict] = []
    server = PluginServer(GpuPlugin(NODE, GPUS, AssignmentSigner(KEY), lambda: list(pods), dev), sockets)
    stop = threading.Event()
    thread = threading.Thread(target=server.run, args=(stop,), daemon=True)
    thread.start()
    deadline = threading.Event()
    for _ in range(100):
        if kubelet.registered:
            break
        deadline.wait(0.05)
    yield kubelet, pods, server, dev
    stop.set()
    thread.join(5)
    kubelet.server.stop(0)


def all_uuids():
    return [g.uuid for g in GPUS]


def test_it_registers_whole_gpus_and_lists_the_nodes_gpus(running):
    kubelet, _, _, _ = running
    (reg,) = kubelet.registered
    assert (reg.version, reg.endpoint, reg.resource_name) == ("v1beta1", ENDPOINT, "nvidia.com/gpu")
    assert reg.options.get_preferred_allocation_available
    assert kubelet.devices() == [(u, "Healthy") for u in all_uuids()]


def test_a_container_gets_exactly_its_signed_assignments_devices(running):
    kubelet, pods, _, dev = running
    pods.append(pod("a", [2, 3], "2026-12-05T10:00:00Z"))
    assert kubelet.preferred(all_uuids(), 2) == ["GPU-gpu-1-2", "GPU-gpu-1-3"]
    got = kubelet.allocate(["GPU-gpu-1-2", "GPU-gpu-1-3"])
    assert [(d.host_path, d.container_path) for d in got.devices] == [
        (str(dev / n), f"/dev/{n}") for n in ("nvidia2", "nvidia3", "nvidiactl")]
    assert got.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-gpu-1-2,GPU-gpu-1-3"
    with pytest.raises(grpc.RpcError) as e:  # given once: a second container cannot take them again
        kubelet.allocate(["GPU-gpu-1-2"])
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_two_waiting_pods_of_one_size_get_each_its_own_gpus_oldest_first(running):
    """The anchors' failure (the plugin guesses the pod by its size): here the kubelet is steered to the oldest
    pod's GPUs, and Allocate hands out only what a waiting pod was assigned."""
    kubelet, pods, _, _ = running
    pods += [pod("late", [0], "2026-12-05T10:00:05Z"), pod("early", [3], "2026-12-05T10:00:01Z")]
    assert kubelet.preferred(all_uuids(), 1) == ["GPU-gpu-1-3"]
    assert kubelet.allocate(["GPU-gpu-1-3"]).envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-gpu-1-3"
    assert kubelet.preferred(["GPU-gpu-1-0", "GPU-gpu-1-1", "GPU-gpu-1-2"], 1) == ["GPU-gpu-1-0"]
    assert kubelet.allocate(["GPU-gpu-1-0"]).envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-gpu-1-0"


@pytest.mark.parametrize("case", ["forged MAC", "no MAC", "MAC of another pod", "another node", "running already", "none"])
def test_devices_no_waiting_pod_was_signed_for_are_refused(running, case):
    kubelet, pods, _, _ = running
    if case == "forged MAC":
        pods.append(pod("f", [1], "t", mac="v1:" + "0" * 12 + ":" + "0" * 64))
    elif case == "no MAC":
        pods.append(pod("f", [1], "t", mac=""))
    elif case == "MAC of another pod":  # the annotations of a pod that got GPU 1, copied onto a new pod
        copied = pod("f", [1], "t", uid="victim")
        copied["metadata"]["uid"] = "copy"
        pods.append(copied)
    elif case == "another node":
        pods.append(pod("f", [1], "t", node="gpu-2"))
    elif case == "running already":
        pods.append(pod("f", [1], "t", phase="Running"))
    with pytest.raises(grpc.RpcError) as e:
        kubelet.allocate(["GPU-gpu-1-1"])
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "no pod bound here waits for nvidia.com/gpu devices ['GPU-gpu-1-1'] with an assignment Tessera signed" \
        in e.value.details()


def test_a_kubelet_restart_is_met_by_a_new_registration(running):
    kubelet, pods, server, _ = running
    kubelet.restart()
    for _ in range(100):  # the kubelet records the Register before the plugin counts its answer: wait for both
        if len(kubelet.registered) == 2 and server.registrations == 2:
            break
        threading.Event().wait(0.05)
    assert len(kubelet.registered) == 2 and server.registrations == 2
    pods.append(pod("a", [0], "t"))
    assert kubelet.allocate(["GPU-gpu-1-0"]).envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-gpu-1-0"


def test_health_changes_reach_the_kubelets_stream():
    plugin = GpuPlugin(NODE, GPUS, AssignmentSigner(KEY), list)
    sick = tuple(GpuDevice(g.index, g.uuid, g.model, g.memory_mib, healthy=g.index != 1) for g in GPUS)
    assert plugin.refresh(sick) is True and plugin.refresh(sick) is False
    assert ("GPU-gpu-1-1", False) in plugin.devices()


def slice_plugin(pods):
    return GpuPlugin(NODE, GPUS, AssignmentSigner(KEY), lambda: list(pods), resource=MILLI_RESOURCE)


def test_slices_are_a_thousand_devices_per_gpu_and_a_slice_gets_its_gpus_share():
    """A 250-milli pod: the kubelet is steered to 250 devices of its assignment's GPU, and its container gets that
    GPU's device node and its share; a second slice of the same GPU gets 250 more of it; 251 devices, or devices of
    another GPU, are no waiting pod's."""
    pods = [pod("s1", [2], "2026-12-05T10:00:00Z", milli=250), pod("s2", [2], "2026-12-05T10:00:01Z", milli=250),
            pod("whole", [0], "2026-12-05T09:00:00Z")]  # a whole-GPU pod is not this resource's
    p = slice_plugin(pods)
    ids = [d for d, _ in p.devices()]
    assert len(ids) == 4000 and ids[0] == "GPU-gpu-1-0::0000" and ids[-1] == "GPU-gpu-1-3::0999"
    first = p.preferred(ids, [], 250)
    assert len(first) == 250 and {p.gpu_of(d) for d in first} == {"GPU-gpu-1-2"}
    e, gpus, count = p.allocate(first)
    assert (e.pod.key, gpus, count) == ("t/s1", ["GPU-gpu-1-2"], 250)
    env, nodes = p.container_devices(gpus, count)
    assert env["TESSERA_GPU_MILLI"] == "250" and nodes[0][1] == "/dev/nvidia2"
    free = [d for d in ids if d not in first]
    second = p.preferred(free, [], 250)
    assert {p.gpu_of(d) for d in second} == {"GPU-gpu-1-2"} and not set(second) & set(first)
    assert p.allocate(second)[0].pod.key == "t/s2"
    rest = [d for d in free if d not in second and p.gpu_of(d) == "GPU-gpu-1-2"]
    with pytest.raises(Refused):
        p.allocate(rest[:1])  # both slices have their share: none waits for more of GPU 2
    pods.append(pod("s3", [1], "2026-12-05T10:00:02Z", milli=100))
    with pytest.raises(Refused):
        p.allocate([d for d in ids if p.gpu_of(d) == "GPU-gpu-1-1"][:101])  # more than its 100
    with pytest.raises(Refused):
        p.allocate([d for d in ids if p.gpu_of(d) == "GPU-gpu-1-3"][:100])  # its size, another GPU
    assert p.allocate([d for d in ids if p.gpu_of(d) == "GPU-gpu-1-1"][:100])[0].pod.key == "t/s3"


def test_an_assignment_naming_its_gpus_by_index_gets_those_gpus():
    """The extender writes a GPU's index as text where it does not know the UUID (a node whose kubelet advertised
    GPUs before its agent's first report: on real nodes the slice pod was refused at admission). Each index counts
    in its own GPU's place only, and the lists must match."""
    pods = [pod("slice", [2], "a", milli=250, uuids=["2"]), pod("whole", [1, 3], "b", uuids=["1", "GPU-gpu-1-3"]),
            pod("elsewhere", [0], "c", milli=100, uuids=["3"]), pod("short", [0, 1], "d", uuids=["0"])]
    assert [(e.pod.key, dict(e.units)) for e in slice_plugin(pods).entitled()] == [("t/slice", {"GPU-gpu-1-2": 250})]
    whole = GpuPlugin(NODE, GPUS, AssignmentSigner(KEY), lambda: list(pods))
    assert [(e.pod.key, dict(e.units)) for e in whole.entitled()] == [("t/whole", {"GPU-gpu-1-1": 1, "GPU-gpu-1-3": 1})]
    e, gpus, count = slice_plugin(pods).allocate([f"GPU-gpu-1-2::{k:04d}" for k in range(250)])
    assert (e.pod.key, gpus, count) == ("t/slice", ["GPU-gpu-1-2"], 250)


def test_the_whole_gpu_plugin_ignores_slice_pods_and_the_slice_plugin_whole_ones():
    pods = [pod("s", [1], "t", milli=500), pod("w", [1], "u")]
    whole = GpuPlugin(NODE, GPUS, AssignmentSigner(KEY), lambda: list(pods))
    assert [e.pod.key for e in whole.entitled()] == ["t/w"]
    assert [e.pod.key for e in slice_plugin(pods).entitled()] == ["t/s"]


def test_an_api_that_cannot_be_read_refuses_in_words_and_gives_nothing():
    def down():
        raise ConnectionRefusedError("[Errno 111] Connection refused")
    p = GpuPlugin(NODE, GPUS, AssignmentSigner(KEY), down)
    with pytest.raises(Refused, match=r"^node gpu-1: cannot read this node's pods from the API \(ConnectionRefusedError"):
        p.allocate(["GPU-gpu-1-0"])
    assert p.answers == {"given": 0, "refused": 1, "guessed": 0}


class PodResources:
    """The kubelet's PodResources `List` (v1) on a unix socket, listing `known`: namespace/name -> {resource: device
    IDs it holds}, the pod manager's pods as the kubelet sees them mid-admission."""

    def __init__(self, socket) -> None:
        self.known: dict[str, dict[str, list[str]]] = {}
        self.calls = 0

        def list_(request, context):
            self.calls += 1
            reply = api.ListPodResourcesResponse()
            for key, held in self.known.items():
                ns, name = key.split("/")
                p = reply.pod_resources.add(name=name, namespace=ns)
                c = p.containers.add(name="c")
                for resource, ids in held.items():
                    c.devices.add(resource_name=resource, device_ids=ids)
            return reply
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("v1.PodResourcesLister", {
            "List": grpc.unary_unary_rpc_method_handler(list_, request_deserializer=api.ListPodResourcesRequest.FromString,
                                                        response_serializer=api.ListPodResourcesResponse.SerializeToString)}),))
        self.server.add_insecure_port(f"unix://{socket}")
        self.server.start()


def test_the_pod_resources_list_encodes_as_the_kubelets_v1_api():
    """ListPodResourcesResponse{pod_resources=1{name=1, namespace=2, containers=3{name=1, devices=2{resource_name=1,
    device_ids=2}}}}, byte by byte; a field the plugin does not declare (cpu_ids=3) is skipped, not an error."""
    r = api.ListPodResourcesResponse()
    r.pod_resources.add(name="p", namespace="n").containers.add(name="c").devices.add(resource_name="r", device_ids=["d"])
    dev = b"\x0a\x01r\x12\x01d"
    container = b"\x0a\x01c\x12" + bytes([len(dev)]) + dev
    pod_ = b"\x0a\x01p\x12\x01n\x1a" + bytes([len(container)]) + container
    assert r.SerializeToString() == b"\x0a" + bytes([len(pod_)]) + pod_
    cpus = b"\x1a\x01\x07"  # ContainerResources.cpu_ids = 3, packed: [7]
    container = container + cpus
    pod_ = b"\x0a\x01p\x12\x01n\x1a" + bytes([len(container)]) + container
    read = api.ListPodResourcesResponse.FromString(b"\x0a" + bytes([len(pod_)]) + pod_)
    assert [list(d.device_ids) for d in read.pod_resources[0].containers[0].devices] == [["d"]]


def test_of_two_waiting_pods_of_one_shape_the_one_the_kubelet_admits_gets_its_own_gpus(tmp_path):
    """Two members of a gang, created in one second, bound to one node at once: the kubelet may admit the younger
    first (its batch is sorted by a creation time of one-second resolution). Mid-admission the kubelet lists the
    pod it admits with no devices yet and has not yet reached the other: the plugin gives the listed one its own
    GPUs, where the order by age alone gave it the other's."""
    kubelet = PodResources(tmp_path / "pr.sock")
    pods = [pod("m-b", [1], "2026-12-05T10:00:00Z"), pod("m-a", [0], "2026-12-05T10:00:00Z")]  # m-a sorts first
    plugin = GpuPlugin(NODE, GPUS, AssignmentSigner(KEY), lambda: list(pods), kubelet_pods=KubeletPods(tmp_path / "pr.sock"))
    kubelet.known = {"t/m-b": {}, "t/other": {GPU_RESOURCE: ["GPU-gpu-1-3"]}}  # admitting m-b; an earlier pod holds GPU 3
    assert plugin.preferred(all_uuids()[:3], [], 1) == ["GPU-gpu-1-1"]
    e, gpus, _ = plugin.allocate(["GPU-gpu-1-1"])
    assert (e.pod.key, gpus, e.guess) == ("t/m-b", ["GPU-gpu-1-1"], False)
    kubelet.known["t/m-b"] = {GPU_RESOURCE: ["GPU-gpu-1-1"]}
    kubelet.known["t/m-a"] = {}  # now m-a
    assert plugin.preferred(["GPU-gpu-1-0", "GPU-gpu-1-2"], [], 1) == ["GPU-gpu-1-0"]
    assert plugin.allocate(["GPU-gpu-1-0"])[0].pod.key == "t/m-a"
    assert plugin.answers == {"given": 2, "refused": 0, "guessed": 0}
    with pytest.raises(Refused):  # m-b's GPU for m-a, as the kubelet's own pick without preferred would be: refused
        pods.append(pod("m-c", [2], "2026-12-05T10:00:00Z"))
        kubelet.known["t/m-c"] = {}
        plugin.allocate(["GPU-gpu-1-1"])


def test_without_the_kubelets_list_the_oldest_goes_first_and_the_guess_is_counted(tmp_path):
    """No socket (not mounted, or the kubelet restarting): the order by age, as before, and /metrics says so."""
    pods = [pod("late", [0], "2026-12-05T10:00:05Z"), pod("early", [3], "2026-12-05T10:00:01Z")]
    plugin = GpuPlugin(NODE, GPUS, AssignmentSigner(KEY), lambda: list(pods),
                       kubelet_pods=KubeletPods(tmp_path / "absent.sock", timeout_s=0.5))
    assert plugin.allocate(["GPU-gpu-1-3"])[0].pod.key == "t/early"
    assert plugin.answers == {"given": 1, "refused": 0, "guessed": 1}
