"""The route (``fast.route``): which kernels each GPU generation runs, decided in one place
from the compute capability — every capability faked here, on the CPU."""

import logging

import pytest
import torch
import triton
import triton.language as tl

import fast  # noqa: F401  (settles the backend before the kernels load)
from fast import route as routes
from fast.kernels.e4m3 import e4m3_bytes_to_f16, e4m3_to_f16
from fast.msa.scorer import block_kernel, hopper_kernel
from fast.route import device_route, route_for
from fast.scorer import plan_scorer
from fast.stock import StockDecode
from indexer_constants import PAGE, SLOTS
from support import DEV

# (capability, route, PDL): sm_90 Hopper's kernels; every other CUDA GPU Triton supports
# the portable ones, PDL from sm_90 on.
ROUTES = [
    ((8, 0), "portable", False),
    ((8, 6), "portable", False),
    ((8, 9), "portable", False),
    ((9, 0), "hopper", True),
    ((10, 0), "portable", True),
    ((12, 0), "portable", True),
]


@pytest.mark.parametrize("capability, name, pdl", ROUTES)
def test_each_capability_takes_its_route(capability, name, pdl):
    route = route_for(capability, "GPU")
    assert (route.name, route.pdl, route.capability, route.forced) == (name, pdl, capability, False)
    assert route.nvfp4_scorer == ("wgmma" if name == "hopper" else "table")
    assert route.sm90 == (capability == (9, 0))
    assert route.hw_e4m3 == (capability >= (8, 9))  # sm_80 / 86 convert E4M3 in integers
    assert f"sm_{capability[0]}{capability[1]}" in route.describe() and name in route.describe()


@pytest.mark.parametrize("capability", [(9, 0), (8, 0), (12, 0)])
def test_fast_route_portable_forces_the_portable_kernels(capability):
    route = route_for(capability, "GPU", force="portable")
    assert route.name == "portable" and route.nvfp4_scorer == "table"
    assert route.forced == (capability == (9, 0))  # elsewhere the portable route is the capability's
    assert route.pdl == (capability >= (9, 0))  # PDL is the hardware's, whatever the kernels
    assert route_for(capability, "GPU", force="auto") == route_for(capability, "GPU")


@pytest.mark.parametrize("capability", [(7, 0), (7, 5), (6, 1)])
def test_below_sm80_is_one_clear_error_naming_the_device(capability):
    with pytest.raises(ValueError) as e:
        route_for(capability, "Tesla T4")
    text = str(e.value)
    major, minor = capability
    assert text.startswith("device: Tesla T4") and f"sm_{major}{minor}" in text and "sm_80" in text


def test_no_gpu_takes_the_interpreter_route():
    route = route_for(None)
    assert (route.name, route.pdl, route.capability, route.nvfp4_scorer) == ("interpreter", False, None, "table")


def test_a_bad_fast_route_names_the_variable(monkeypatch):
    monkeypatch.setenv(routes.ROUTE_ENV, "hoper")
    with pytest.raises(ValueError, match="FAST_ROUTE: 'hoper'"):
        device_route(torch.device("cpu"))
    with pytest.raises(ValueError, match="FAST_ROUTE"):
        StockDecode(heads=4, max_reqs=1, device="cpu")


@pytest.fixture
def fake_gpu(monkeypatch):
    """Make CUDA device 0 report a capability of the test's choice (no GPU is touched: the
    route is decided before anything is allocated)."""

    def fake(capability):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: capability)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "Faked GPU")
        routes._cuda_route.cache_clear()

    yield fake
    routes._cuda_route.cache_clear()


@pytest.mark.parametrize("capability, name, pdl", ROUTES)
def test_device_route_reads_the_devices_capability(fake_gpu, monkeypatch, capability, name, pdl):
    fake_gpu(capability)
    monkeypatch.delenv(routes.ROUTE_ENV, raising=False)
    route = device_route(torch.device("cuda", 0))
    assert (route.name, route.pdl) == (name, pdl) and route.device.startswith("Faked GPU (sm_")
    monkeypatch.setenv(routes.ROUTE_ENV, "portable")
    assert device_route(torch.device("cuda", 0)).name == "portable"


def test_decodes_refuse_an_old_gpu_at_construction(fake_gpu):
    """Before any buffer is allocated: the check is the constructor's first word on the device."""
    from fast import MsaStockDecode

    fake_gpu((7, 5))
    for make, extra in ((StockDecode, {}), (MsaStockDecode, dict(key_format="bf16", init_blocks=1, local_blocks=2))):
        with pytest.raises(ValueError, match=r"device: Faked GPU \(sm_75\) is not supported"):
            make(heads=4, max_reqs=1, device="cuda:0", **extra)


def test_decodes_log_the_route_they_took(caplog):
    from fast import MsaStockDecode

    with caplog.at_level(logging.INFO, logger="fast"):
        stock = StockDecode(heads=4, max_reqs=1, device="cpu", pdl=True)
        msa = MsaStockDecode(heads=4, max_reqs=1, device="cpu", key_format="fp8", init_blocks=1, local_blocks=2)
    assert stock.route.name == msa.route.name == "interpreter"
    assert not stock.pdl  # asked for, but the interpreter has none
    assert caplog.text.count("interpreter route") == 2
    assert "StockDecode" in caplog.text and "MsaStockDecode" in caplog.text


def _scorer_operands(batch=1, pages=2, hs=1):
    q = torch.zeros(batch, SLOTS, hs, 128, dtype=torch.uint8)
    cache = torch.zeros(pages, PAGE, 72, dtype=torch.uint8)
    table = torch.zeros(batch, pages, dtype=torch.int32)
    lens = torch.full((batch,), pages * PAGE + 1, dtype=torch.int32)
    out = torch.zeros(batch, SLOTS * hs, pages)
    return q, cache, table, lens, out


@pytest.mark.parametrize("capability, name, pdl", ROUTES)
def test_score_pages_launches_the_routes_kernel(monkeypatch, capability, name, pdl):
    """The NVFP4 scorer's default kernel follows the route; the Hopper kernel asked for by
    name, or PDL, where the device has none is an error naming the argument."""
    import fast.scorer as scorer

    route = route_for(capability, "Faked GPU")
    monkeypatch.setattr(scorer, "device_route", lambda device: route)
    monkeypatch.setattr(scorer, "sm_count", lambda device: 132)
    launch = plan_scorer(*_scorer_operands())
    assert launch.kernel is (scorer.score_kernel_wgmma if name == "hopper" else scorer.score_kernel_table)
    assert launch.options["PDL"] is False
    if not route.sm90:
        with pytest.raises(ValueError, match="kernel: 'wgmma' needs an sm_90 GPU, not Faked GPU"):
            plan_scorer(*_scorer_operands(), kernel="wgmma")
    if not pdl:
        with pytest.raises(ValueError, match=r"pdl: Faked GPU \(sm_\d+\) has no PDL"):
            plan_scorer(*_scorer_operands(), pdl=True)
    else:
        assert plan_scorer(*_scorer_operands(), pdl=True).options["PDL"] is True


@pytest.mark.parametrize("capability, name, pdl", ROUTES)
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.bfloat16])
@pytest.mark.parametrize("rows", [8, 16, 32, 64])
def test_score_blocks_default_kernel_follows_the_route(capability, name, pdl, dtype, rows):
    route = route_for(capability, "GPU")
    assert block_kernel(route, dtype, rows) == (hopper_kernel(dtype, rows) if name == "hopper" else "dot")
    assert block_kernel(route_for(None), dtype, rows) == "dot"


@triton.jit
def _convert(src, dst, HW: tl.constexpr):
    i = tl.arange(0, 256)
    if HW:
        tl.store(dst + i, e4m3_bytes_to_f16(tl.load(src + i), True))
    else:
        tl.store(dst + i, e4m3_to_f16(tl.load(src + i)))


@pytest.mark.parametrize("hw", [False, True])
def test_e4m3_bytes_convert_exactly_with_or_without_the_hardware_conversion(hw):
    """E4M3 -> fp16 in integer arithmetic (the portable kernels' on sm_80 / 86, which have
    no conversion) and by the hardware, on all 256 bytes, against torch's, NaN bytes
    included."""
    src = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    dst = torch.empty(256, dtype=torch.float16, device=DEV)
    _convert[(1,)](src.to(DEV), dst, HW=hw)
    dst = dst.cpu()
    want = src.view(torch.float8_e4m3fn).to(torch.float16)
    if not hw:  # the kernels zero NaN bytes before the hardware's conversion; the integer one keeps them NaN
        assert torch.equal(dst.isnan(), want.isnan()) and want.isnan().sum() == 2
    ok = ~want.isnan()
    assert torch.equal(dst[ok].view(torch.int16), want[ok].view(torch.int16))  # bits: -0 stays -0
