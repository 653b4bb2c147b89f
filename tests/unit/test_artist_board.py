"""The board of open questions to the artist (treegrpo/comfyui/artist/questions.py), without a server: which tab is
served which questions, and when a queued prompt says the person is back. Pure bookkeeping: no clock compared."""
import time

from treegrpo.comfyui.artist.questions import ArtistBoard, Question


def _ask(board, client, tree=0):
    return board.ask(Question(prompt_id="p1", client_id=client, tree=tree, prompt="a red circle", images=[{}] * 4,
                              groups=[[0, 1], [2, 3]], mode="favourites", timeout_s=600))


def test_a_page_opened_again_takes_over_the_questions_of_a_tab_that_closed():
    """A closed tab's question (its websocket gone) is served to the page opened again (a new client id), which can
    answer it; while the tab is open, another one gets only the count (two open tabs do not both ask)."""
    open_tabs = {"tab-1", "tab-2"}
    board = ArtistBoard(connected=lambda cid: cid in open_tabs)
    q = _ask(board, "tab-1")
    assert [x["nonce"] for x in board.pending("tab-1")["questions"]] == [q.nonce]
    assert board.pending("tab-2") == {"questions": [], "waiting_elsewhere": 1, "away": 0}
    open_tabs.discard("tab-1")                        # the tab was closed; a new one opens
    open_tabs.add("tab-3")
    got = board.pending("tab-3")
    assert [x["nonce"] for x in got["questions"]] == [q.nonce] and got["waiting_elsewhere"] == 0
    assert board.answer(q.id, q.nonce, {"mode": "favourites", "good": [1]}) == (200, "ok")
    assert board.pending("tab-3") == {"questions": [], "waiting_elsewhere": 0, "away": 0}
    # a prompt queued without a page (the API, no client id) is answerable from any open page
    q2 = _ask(board, None, tree=1)
    assert [x["nonce"] for x in board.pending("tab-2")["questions"]] == [q2.nonce]


def test_a_prompt_queued_after_a_tree_fell_back_says_the_artist_is_back_and_one_queued_before_does_not():
    board = ArtistBoard()
    before = time.time() - 60                         # queued a minute before (a batch, Auto Queue)
    board.fell_back("tab")
    board.back("tab", queued_at=before)
    assert board.away("tab") == 1                     # still away: that prompt was queued before they left
    board.back("tab", queued_at=time.time() + 1)      # queued after the tree fell back: the person is here
    assert board.away("tab") == 0
    board.fell_back("tab")
    board.back("tab")                                 # when unknown: queued now
    assert board.away("tab") == 0 and board.away_summary() is None
