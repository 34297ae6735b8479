import numpy as np
import pytest

from fedlm import data
from fedlm.config import DataConfig


@pytest.fixture(scope="module")
def corpus():
    return data.load_corpus(DataConfig(seq_len=64))


def test_parse_play_keeps_speakers_and_dialogue_only():
    md = ("# Twelfth Night\n\n## ACT I\n\n### SCENE I. A palace.\n\n_Enter DUKE_\n\n"
          "**DUKE ORSINO**  \nIf music be the food of love, play on;  \nGive me excess of it.\n\n"
          "**CURIO**  \nWill you go hunt, my lord?\n\n_Exeunt_\n")
    title, text = data.parse_play(md)
    assert title == "Twelfth Night"
    assert text == ("DUKE ORSINO:\nIf music be the food of love, play on;\nGive me excess of it.\n"
                    "\nCURIO:\nWill you go hunt, my lord?\n")


def test_shipped_corpus_is_the_38_plays_in_six_genres(corpus):
    docs = data.document_rows(DataConfig())
    assert len(docs) == 38 and all(set(d) == {"title", "genre", "text"} for d in docs)
    assert {d["genre"] for d in docs} == {"comedies", "histories", "problems", "roman",
                                          "romances", "tragedies"}
    assert "Hamlet" in " ".join(d["title"] for d in docs)
    assert sum(len(d["text"]) for d in docs) > 4_000_000
    assert corpus.train.shape[1] == 65 and corpus.val.shape[1] == 65
    assert corpus.train.dtype == np.uint8


def test_byte_tokenizer_round_trips():
    text = "O Romeo, Romeo! wherefore art thou Romeo? — ’tis"
    assert data.decode(data.encode(text)) == text
    assert max(data.encode(text)) < data.VOCAB_SIZE


def test_validation_is_each_documents_tail_and_never_trained_on(corpus):
    # Every validation window comes from the tail of its document; no training
    # window overlaps it, so the two sets of 65-byte strings are disjoint.
    train = {row.tobytes() for row in corpus.train}
    assert not any(row.tobytes() in train for row in corpus.val)
    assert 0.02 < len(corpus.val) / len(corpus.train) < 0.08


@pytest.mark.parametrize("scheme", ["iid", "by-play", "dirichlet"])
def test_partitions_are_disjoint_and_cover_the_training_set(corpus, scheme):
    shards = data.partition(corpus, DataConfig(partition=scheme, seq_len=64), 4, seed=0)
    joined = np.concatenate(shards)
    assert len(joined) == len(np.unique(joined)) == len(corpus.train)
    again = data.partition(corpus, DataConfig(partition=scheme, seq_len=64), 4, seed=0)
    assert all(np.array_equal(a, b) for a, b in zip(shards, again))


def test_by_play_gives_whole_plays_to_one_worker(corpus):
    shards = data.partition(corpus, DataConfig(partition="by-play", seq_len=64), 4, seed=0)
    owners = [set(corpus.train_doc[s].tolist()) for s in shards]
    for a in range(4):
        for b in range(a + 1, 4):
            assert not owners[a] & owners[b]
    sizes = [len(s) for s in shards]
    assert max(sizes) / min(sizes) < 1.2  # balanced by size


def test_dirichlet_skews_genres_more_than_iid(corpus):
    genres = np.asarray(corpus.genres)[corpus.train_doc]

    def skew(scheme, alpha=0.1):
        shards = data.partition(corpus, DataConfig(partition=scheme, alpha=alpha, seq_len=64),
                                4, seed=0)
        # mean over workers of the share of their most common genre
        return np.mean([np.unique(genres[s], return_counts=True)[1].max() / len(s)
                        for s in shards])

    assert skew("dirichlet") > skew("iid") + 0.15


def test_job_batches_depend_only_on_the_seed():
    shard = np.arange(100, 200)
    a = data.job_batches(shard, steps=5, batch_size=4, data_seed=42)
    b = data.job_batches(shard, steps=5, batch_size=4, data_seed=42)
    c = data.job_batches(shard, steps=5, batch_size=4, data_seed=43)
    assert a.shape == (5, 4) and np.array_equal(a, b) and not np.array_equal(a, c)
    assert set(a.ravel()) <= set(shard)


def test_local_text_source(tmp_path):
    (tmp_path / "poems").mkdir()
    (tmp_path / "poems" / "a.txt").write_text("Shall I compare thee to a summer's day?\n" * 40)
    (tmp_path / "poems" / "b.txt").write_text("My mistress' eyes are nothing like the sun;\n" * 40)
    cfg = DataConfig(source=f"text:{tmp_path}/poems/*.txt", seq_len=32)
    c = data.load_corpus(cfg)
    assert c.titles == ("a", "b") and c.genres == ("poems", "poems")
    assert len(c.train) > 0 and len(c.val) > 0
