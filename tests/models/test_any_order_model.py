"""The any-order GPT: its decode-time forwards (prefill, windows along the order, draft queries)
give exactly the training forward's conditionals, and it starts as the raster model it came from."""

import pytest
import torch

from conftest import tiny_llamagen
from visualspec.models.any_order import AnyOrderGPT, check_orders

CELLS, V, T = 16, 11, 3


def tiny_any_order(seed=0, model_type="t2i"):
    extra = dict(caption_dim=8, cls_token_num=T, prefix_rope="identity") if model_type == "t2i" else {}
    raster = tiny_llamagen(seed=seed, vocab_size=V, block_size=CELLS, model_type=model_type, **extra)
    model = AnyOrderGPT.from_raster(raster)
    torch.nn.init.normal_(model.query_embeddings.weight, std=0.5)
    return model.eval()


@pytest.fixture(scope="module")
def batch():
    torch.manual_seed(1)
    cond = torch.randn(2, T, 8, dtype=torch.float64)
    mask = torch.ones(2, T, dtype=torch.long)
    mask[0, 0] = 0  # a padded caption slot
    tokens = torch.randint(0, V, (2, CELLS))
    orders = torch.stack([torch.randperm(CELLS) for _ in range(2)])
    return cond, mask, tokens, orders


def swapped(orders, a, b):
    out = orders.clone()
    out[:, a], out[:, b] = orders[:, b], orders[:, a]
    return out


@pytest.mark.parametrize("kept", [0, 3])
def test_decode_forwards_give_the_training_forwards_conditionals(batch, kept):
    model = tiny_any_order()
    cond, mask, tokens, orders = batch
    train = model(cond, tokens, cond_mask=mask, orders=orders)  # row s: the cell orders[:, s]
    seq = tokens.gather(1, orders)
    first = model.prefill((cond, mask, orders, seq[:, :kept]), CELLS - kept)
    assert torch.allclose(first, train[:, kept], atol=1e-10)
    window = model.forward_window(seq[:, kept:kept + 5], 0)
    assert torch.allclose(window, train[:, kept + 1:kept + 6], atol=1e-10)
    # drafts of generated positions 3..6 from the positions before 3: each cell's conditional as if
    # it came next in the order
    queries = model.forward_queries(seq[:, kept + 2:kept + 3], 3, 4)
    for j in range(4):
        moved = model(cond, tokens, cond_mask=mask, orders=swapped(orders, kept + 3, kept + 3 + j))
        assert torch.allclose(queries[:, j], moved[:, kept + 3], atol=1e-10), j
    # the window after the drafts still verifies along the order (the queries left no trace)
    assert torch.allclose(model.forward_window(seq[:, kept + 2:kept + 6], 2), train[:, kept + 3:kept + 7], atol=1e-10)


def test_queries_after_several_new_tokens_see_them_all(batch):
    """The parallel decoder's step: the last step's tokens written and the next cells predicted in one forward."""
    model = tiny_any_order()
    cond, mask, tokens, orders = batch
    seq = tokens.gather(1, orders)
    model.prefill((cond, mask, orders, None), CELLS)
    model.forward_window(seq[:, :2], 0)
    queries = model.forward_queries(seq[:, 2:5], 5, 3)  # positions 2..4 written, 5..7 predicted from < 5
    for j in range(3):
        moved = model(cond, tokens, cond_mask=mask, orders=swapped(orders, 5, 5 + j))
        assert torch.allclose(queries[:, j], moved[:, 5], atol=1e-10), j


def test_rows_keep_their_orders_when_the_batch_drops_rows(batch):
    model = tiny_any_order()
    cond, mask, tokens, orders = batch
    seq = tokens.gather(1, orders)
    train = model(cond, tokens, cond_mask=mask, orders=orders)
    model.prefill((cond, mask, orders, None), CELLS)
    model.forward_window(seq[:, :4], 0)
    model.select(torch.tensor([1]))
    assert torch.allclose(model.forward_window(seq[1:, 3:6], 3), train[1:, 4:7], atol=1e-10)


def test_zero_queries_in_raster_order_are_the_raster_model():
    raster = tiny_llamagen(seed=3, vocab_size=V, block_size=CELLS)
    model = AnyOrderGPT.from_raster(raster)
    labels, tokens = torch.tensor([0, 2]), torch.randint(0, V, (2, CELLS))
    assert torch.equal(model(labels, tokens), raster(labels, tokens))
    assert model(labels, tokens, orders=torch.arange(CELLS).expand(2, CELLS)).equal(raster(labels, tokens))


def test_from_raster_takes_a_raster_gpt_only():
    for other in (tiny_any_order(), torch.nn.Linear(2, 2)):
        with pytest.raises(ValueError, match="from_raster takes a raster LlamaGenGPT"):
            AnyOrderGPT.from_raster(other)


@pytest.mark.parametrize("orders, message", [
    (torch.tensor([[0, 1, 2]]), r"expected shape \(B, 4\)"),
    (torch.tensor([[0, 1, 1, 3]]), "permutation of 0..3"),
    (torch.tensor([[0.0, 1, 2, 3]]), "permutation of 0..3"),
])
def test_an_order_must_be_a_permutation_of_the_cells(orders, message):
    with pytest.raises(ValueError, match=message):
        check_orders(orders, 4)


def test_a_prefill_names_its_bad_prefix(batch):
    model = tiny_any_order()
    cond, mask, tokens, orders = batch
    with pytest.raises(ValueError, match=r"prefix is \(caption_features, caption_mask, orders, kept\)"):
        model.prefill((cond, mask), CELLS)
    with pytest.raises(ValueError, match="generates the other 13"):
        model.prefill((cond, mask, orders, tokens[:, :3]), CELLS)
