"""Device maps: the budget Accelerate gets for faked GPU counts, and a real device-map load on this host."""
import pytest
import torch

from jevany_daemon.config import EngineConfig
from jevany_daemon.model.checkpoint import ModelLoadError
from jevany_daemon.model.loading import load_model
from jevany_daemon.model.placement import GIB, Placement, check_placed, gpu_indices, plan

H200_FREE = {0: 139 * GIB, 1: 138 * GIB, 2: 137 * GIB, 3: 136 * GIB}


def fake_host(n: int):
    """gpu_count and free_bytes of a host with n GPUs."""
    return {"gpu_count": lambda: n, "free_bytes": lambda i: H200_FREE[i]}


# --- the budget ---------------------------------------------------------------------------

def test_a_cap_applies_to_every_listed_gpu_and_only_those():
    p = plan("cuda:0,cuda:2", "auto", 40.0, **fake_host(4))
    assert p.max_memory == {0: 40 * GIB, 2: 40 * GIB}
    assert p.from_pretrained_kwargs() == {"device_map": "auto", "max_memory": {0: 40 * GIB, 2: 40 * GIB}}
    assert p.device == torch.device("cuda", 0) and p.mapped and p.move_to is None


def test_cuda_alone_means_every_visible_gpu():
    assert plan("cuda", "balanced", None, **fake_host(3)).max_memory == {0: 139 * GIB, 1: 138 * GIB, 2: 137 * GIB}
    assert plan("cuda", "sequential", 0.5, **fake_host(2)).max_memory == {0: GIB // 2, 1: GIB // 2}


def test_without_a_cap_each_gpu_may_take_what_is_free_on_it():
    p = plan("cuda:3,cuda:1", "balanced_low_0", None, **fake_host(4))
    assert p.max_memory == {3: 136 * GIB, 1: 138 * GIB} and p.device == torch.device("cuda", 3)


def test_a_cap_in_fractions_of_a_gib_is_whole_bytes():
    assert plan("cuda:0", "auto", 1.3, **fake_host(1)).max_memory == {0: int(1.3 * GIB)}


@pytest.mark.parametrize("device,count,message", [
    ("cuda", 0, "CUDA is not available to this process"),
    ("cuda:2", 2, r"only 2 CUDA device\(s\) are visible"),
    ("cuda:0,cuda:0", 2, "names one GPU twice"),
    ("cuda,cuda:1", 2, "names one GPU twice"),
    ("cuda:0,cpu", 2, "unknown device 'cpu' for a device map"),
    ("gpu", 2, "unknown device 'gpu'"),
])
def test_gpus_that_cannot_be_had(device, count, message):
    with pytest.raises(ModelLoadError, match=message):
        plan(device, "auto", None, **fake_host(count))


@pytest.mark.parametrize("device_map,gib,message", [
    ("everywhere", None, "unknown device_map 'everywhere'"),
    ("auto", 0, "max_memory_gib must be a positive number"),
    ("auto", -2.0, "max_memory_gib must be a positive number"),
    ("auto", float("inf"), "max_memory_gib must be a positive number"),
    ("auto", True, "max_memory_gib must be a positive number"),
])
def test_bad_device_map_arguments(device_map, gib, message):
    with pytest.raises(ModelLoadError, match=message):
        plan("cuda", device_map, gib, **fake_host(2))


def test_no_device_map_is_a_whole_model_on_one_device():
    p = Placement(torch.device("cpu"))
    assert not p.mapped and p.move_to == torch.device("cpu") and p.from_pretrained_kwargs() == {}
    assert gpu_indices(["cuda:1", "cuda:0"], 2) == [1, 0]


def test_a_cpu_map_budgets_the_host_memory():
    p = plan("cpu", "auto", 2.0)
    assert p.max_memory == {"cpu": 2 * GIB} and p.device == torch.device("cpu")
    assert plan("cpu", "auto", None).max_memory["cpu"] > 0


@pytest.fixture(scope="module")
def empty_tiny(tiny_model):
    """The tiny qwen3 model's skeleton on the meta device: 11 MiB of fp32 weights in 4 layers."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(tiny_model("qwen3"))    # built, if need be, outside the meta context
    with init_empty_weights():
        return AutoModelForCausalLM.from_config(config)


def planned_map(model, device_map, max_memory) -> dict:
    """What from_pretrained would place where, with this budget (transformers' own planner, no GPU needed)."""
    from transformers.integrations.accelerate import _get_device_map

    return dict(_get_device_map(model, device_map, dict(max_memory), None))


@pytest.mark.parametrize("device_map", ["auto", "balanced", "sequential"])
def test_on_two_faked_gpus_the_map_uses_both_and_nothing_else(empty_tiny, device_map):
    # sequential fills GPU 0 first, so a cap of 8 MiB makes it spill onto GPU 1
    p = plan("cuda:0,cuda:1", device_map, 0.008 if device_map == "sequential" else None, **fake_host(2))
    where = planned_map(empty_tiny, device_map, p.max_memory)
    assert set(where.values()) == {0, 1}
    # Inputs enter on GPU 0 and hidden states leave on GPU 1, while the tied LM head stays with the
    # embedding on GPU 0: readouts must bring the two together (see the engine's device notes).
    assert (where["model.embed_tokens"], where["model.norm"], where["lm_head"]) == (0, 1, 0)


def test_on_faked_gpus_a_budget_too_small_leaves_weights_for_the_disk(empty_tiny):
    p = plan("cuda:0,cuda:1", "sequential", 0.004, **fake_host(2))
    assert "disk" in planned_map(empty_tiny, "sequential", p.max_memory).values()   # what check_placed refuses


# --- a real load with a device map on this host -------------------------------------------

def answers(model, bodies) -> list[dict]:
    """Every question's probabilities, request by request."""
    from jevany_daemon.engine.engine import Engine

    engine = Engine(model, EngineConfig())
    return [{qid: a["probabilities"] for qid, a in engine.decide(b)["answers"].items()} for b in bodies]


def max_diff(a: list[dict], b: list[dict]) -> float:
    assert [r.keys() for r in a] == [r.keys() for r in b]
    return max(abs(p - rb[qid][k]) for ra, rb in zip(a, b) for qid in ra for k, p in ra[qid].items())


@pytest.mark.parametrize("readout", ["choice", "pointer"])
@pytest.mark.parametrize("device_map", ["auto", {"": "cpu"}])
def test_a_device_map_load_answers_like_a_normal_load(tiny_model, loaded_model, readout, device_map):
    from jevany_daemon import workloads

    mapped = load_model(str(tiny_model("qwen3", readout)), device="cpu", device_map=device_map,
                        max_memory_gib=4.0 if isinstance(device_map, str) else None)
    assert mapped.device == mapped.output_device == torch.device("cpu")
    assert mapped.devices == (torch.device("cpu"),)
    assert not mapped.causal_lm.training and not any(p.requires_grad for p in mapped.causal_lm.parameters())
    if readout == "pointer":
        assert next(mapped.head.parameters()).device == mapped.output_device
    bodies = workloads.short(6, seed=31)
    assert answers(mapped, bodies) == answers(loaded_model("qwen3", readout), bodies)


def test_a_model_that_does_not_fit_is_refused_not_offloaded(tiny_model):
    # A budget of about a kilobyte: Accelerate would put every layer on disk.
    with pytest.raises(ModelLoadError, match=r"does not fit the memory the device map may use \(cpu: 0.00 GiB\)"):
        load_model(str(tiny_model("qwen3")), device="cpu", device_map="sequential", max_memory_gib=1e-6)


def test_check_placed_counts_weights_off_the_budgeted_devices():
    model = torch.nn.Linear(4, 4)
    check_placed(model, Placement(torch.device("cpu"), "auto", {"cpu": GIB}), "m")       # all on the CPU
    with pytest.raises(ModelLoadError, match=r"'m' does not fit .*\(cuda:0: 1.00 GiB, cuda:1: 1.00 GiB\)"):
        check_placed(model, Placement(torch.device("cuda", 0), "auto", {0: GIB, 1: GIB}), "m")
    meta = torch.nn.Linear(4, 4, device="meta")
    with pytest.raises(ModelLoadError, match="does not fit"):
        check_placed(meta, Placement(torch.device("cpu"), "auto", {"cpu": GIB}), "m")


def test_the_input_and_output_devices_of_a_spread_model():
    """Inputs go to the embedding's device and hidden states come out at the final norm's."""
    from jevany_daemon.model.placement import input_device, model_devices, output_device

    class Decoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = torch.nn.Embedding(8, 4, device="meta")
            self.layer = torch.nn.Linear(4, 4)
            self.norm = torch.nn.LayerNorm(4, device="meta")

    class CausalLM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = Decoder()

        def get_decoder(self):
            return self.model

        def get_input_embeddings(self):
            return self.model.embed_tokens

    lm = CausalLM()
    assert input_device(lm) == torch.device("meta") and output_device(lm) == torch.device("meta")
    assert model_devices(lm) == (torch.device("meta"), torch.device("cpu"))
    lm.model.norm = None     # a decoder without a norm: its last parameter says
    assert output_device(lm) == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs CUDA (two GPUs)")
def test_a_model_spread_over_two_gpus_answers_like_one_on_the_cpu(tiny_model, loaded_model):
    from jevany_daemon import workloads

    # balanced splits even an 11 MiB model: GPU 0 gets about half, so the embedding and the norm part ways.
    spread = load_model(str(tiny_model("qwen3", "pointer")), device="cuda:0,cuda:1", device_map="balanced")
    assert set(spread.devices) == {torch.device("cuda", 0), torch.device("cuda", 1)}
    assert (spread.device, spread.output_device) == (torch.device("cuda", 0), torch.device("cuda", 1))
    bodies = workloads.short(6, seed=31)
    assert max_diff(answers(loaded_model("qwen3", "pointer"), bodies), answers(spread, bodies)) <= 1e-5
