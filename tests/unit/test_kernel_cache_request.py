"""`prebake kernel-cache`'s use case (engine/vllm/kernel_cache.py) refuses a request it cannot serve
before it opens the store or the registry: a --to that is no OCI reference, a footprint half given,
a recipe of another engine; each refusal names the fix."""

from __future__ import annotations

import pytest

from prebake.artifacts.errors import PrebakeError
from prebake.engine.vllm.kernel_cache import KernelCacheRequest, push_kernel_cache


def _never_opened():
    raise AssertionError("the request was refused too late: the context was opened")


@pytest.mark.parametrize(
    ("request_", "says"),
    [
        (KernelCacheRequest("tiny-llama-vllm", to="registry.local/team/kc:tag"), "write oci://HOST"),
        (KernelCacheRequest("tiny-llama-vllm", to="oci://registry.local/team/kc"), "write oci://HOST"),
        (KernelCacheRequest("tiny-llama-vllm", to="oci://r/t/kc:t", runtime_image="vllm/vllm-openai"), "go together"),
        (KernelCacheRequest("tiny-llama", to="oci://registry.local/team/kc:tag"), "engine = 'vllm'"),
    ],
)
def test_a_request_it_cannot_serve_is_refused_before_anything_opens(request_, says):
    with pytest.raises(PrebakeError, match=says):
        push_kernel_cache(request_, _never_opened)


def test_the_address_and_tag_of_a_good_reference():
    request = KernelCacheRequest("tiny-llama-vllm", to="oci://registry.local:5000/team/vllm-cache:tiny")
    assert request.address_and_tag() == ("oci://registry.local:5000/team/vllm-cache", "tiny")
