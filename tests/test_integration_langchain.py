"""The LangChain v1 middleware with LangChain's real agent (``create_agent``), a fake chat model
that records every request, and a tool with large outputs; and the recall tool read back."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest

langchain = pytest.importorskip(
    "langchain", reason='the LangChain extra is not installed: pip install "ctxrules[langchain]"'
)

from invariants import pairing_problems  # noqa: E402
from langchain.agents import create_agent  # noqa: E402
from langchain_core.callbacks import CallbackManagerForLLMRun  # noqa: E402
from langchain_core.language_models import BaseChatModel  # noqa: E402
from langchain_core.messages import (  # noqa: E402
    AIMessage,
    BaseMessage,
    HumanMessage,
    RemoveMessage,
    ToolMessage,
    convert_to_openai_messages,
)
from langchain_core.outputs import ChatGeneration, ChatResult  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402

from ctxrules.errors import CtxrulesError  # noqa: E402
from ctxrules.integrations.langchain import CtxrulesMiddleware  # noqa: E402
from ctxrules.messages import is_injected  # noqa: E402
from ctxrules.models import lookup_model  # noqa: E402
from ctxrules.tokens import TokenCounter  # noqa: E402

TURNS = 60
WINDOW = 24_000
MARKER = re.compile(r"\[ctxrules:elided kind=(\w+) count=\d+ ref=vault://([0-9a-f]{64})")


def big_output(n: int) -> str:
    """A long, realistic log: distinct lines the pack will reduce (head + tail + marker)."""
    return "".join(
        f"[{n:03d}] worker {i % 7}: processed batch {i:05d} in {(i * 37) % 997} ms, ok\n" for i in range(700)
    )


@tool
def run_job(n: int) -> str:
    """Run job number n and return its log."""
    return big_output(n)


class RecordingModel(BaseChatModel):
    """Answers with a tool call for ``TURNS`` turns, asks to recall a marker once, then stops;
    records the messages of every request."""

    requests: list[list[BaseMessage]] = []  # noqa: RUF012 - a pydantic field, copied per instance
    recall_name: str = "ctxrules_recall"
    recalled: dict[str, Any] = {}  # noqa: RUF012 - a pydantic field, copied per instance

    @property
    def _llm_type(self) -> str:
        return "recording-fake"

    def bind_tools(self, tools: Any, **kwargs: Any) -> RecordingModel:
        return self

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.requests.append(list(messages))
        turn = len(self.requests)
        if turn == TURNS // 2 and not self.recalled:
            # Ask for the lines behind the first marker the model can see.
            for msg in messages:
                found = MARKER.search(msg.content if isinstance(msg.content, str) else "")
                if found:
                    self.recalled.update(kind=found.group(1), id=found.group(2), turn=turn)
                    call = {
                        "id": f"recall-{turn}",
                        "name": self.recall_name,
                        "args": {"id": found.group(2)[:16], "lines": "1:4"},
                    }
                    return ChatResult(generations=[ChatGeneration(message=AIMessage("", tool_calls=[call]))])
        job = turn - (1 if self.recalled.get("turn", turn) < turn else 0)
        if job <= TURNS:
            call = {"id": f"call-{job}", "name": "run_job", "args": {"n": job}}
            return ChatResult(generations=[ChatGeneration(message=AIMessage(f"Running job {job}.", tool_calls=[call]))])
        return ChatResult(generations=[ChatGeneration(message=AIMessage("All jobs ran."))])


def _check_requests(requests: list[list[BaseMessage]], middleware: CtxrulesMiddleware) -> None:
    counter = TokenCounter.for_model(lookup_model("gpt-4o"))
    usable = middleware.session_for("t-1").budget.usable
    for n, messages in enumerate(requests, 1):
        dicts = [convert_to_openai_messages(m) for m in messages]
        assert pairing_problems(dicts) == [], n
        assert counter.count_messages(dicts) <= usable, (n, counter.count_messages(dicts), usable)


def test_every_request_fits_with_valid_pairing_and_the_state_keeps_everything(tmp_path: Path) -> None:
    model = RecordingModel()
    model.requests = []
    model.recalled = {}
    middleware = CtxrulesMiddleware(model="gpt-4o", window=WINDOW, state=tmp_path / "state")
    agent = create_agent(
        model,
        tools=[run_job],
        middleware=[middleware],
        system_prompt="You run batch jobs.",
        checkpointer=InMemorySaver(),
    )
    config = {"configurable": {"thread_id": "t-1"}, "recursion_limit": 1000}
    state = agent.invoke({"messages": [HumanMessage("Run the jobs one by one.")]}, config)
    assert len(model.requests) == TURNS + 2  # 60 jobs, one recall, the final answer
    _check_requests(model.requests, middleware)
    # The graph state still holds every message, tool outputs verbatim.
    tool_messages = [m for m in state["messages"] if isinstance(m, ToolMessage)]
    jobs = [m for m in tool_messages if m.tool_call_id.startswith("call-")]
    assert len(jobs) == TURNS
    assert all(m.content == big_output(int(m.tool_call_id.split("-")[1])) for m in jobs)
    # The model saw the compacted history: later requests are far smaller than the state.
    last = model.requests[-1]
    assert sum(len(str(m.content)) for m in last) < sum(len(str(m.content)) for m in state["messages"]) / 5
    # The system prompt reached the model, and unchanged messages are the state's own objects.
    assert last[0].type == "system" and last[0].content == "You run batch jobs."
    state_ids = {id(m) for m in state["messages"]}
    assert any(id(m) in state_ids for m in last[1:])
    # The recall tool gave back the exact originals behind the marker: for removed steps, one
    # message per line, each the exact JSON of the message as it was.
    recalled = model.recalled
    assert recalled and recalled["kind"] == "message", recalled
    (answer,) = [m for m in tool_messages if m.tool_call_id == f"recall-{recalled['turn']}"]
    lines = answer.content.splitlines()
    assert len(lines) == 4
    first = [json.loads(line) for line in lines]
    assert [m["role"] for m in first] == ["assistant", "tool", "assistant", "tool"]
    assert first[1]["tool_call_id"] == "call-1" and first[3]["tool_call_id"] == "call-2"
    # The step was removed as the model last saw it: its output already reduced, with a marker
    # of its own, which the recall tool follows too (nested markers are this session's).
    session = middleware.session_for("t-1")
    for n, content in ((1, first[1]["content"]), (2, first[3]["content"])):
        original = big_output(n).splitlines(keepends=True)
        inner = re.search(r"ref=vault://([0-9a-f]{64})#L(\d+)-L(\d+)", content)
        assert inner, content[-300:]
        a = int(inner.group(2))
        page = session.recall({"id": inner.group(1), "lines": f"{a}:{a + 19}"})
        assert page == "".join(original[a - 1 : a + 19])
        assert content.startswith("".join(original[: a - 1]))
    # A recalled output has the file_read role: the model saw it whole on the next call.
    nxt = model.requests[recalled["turn"]]
    assert any(isinstance(m, ToolMessage) and m.content == answer.content for m in nxt)


def test_the_async_path_prepares_the_same_way(tmp_path: Path) -> None:
    model = RecordingModel()
    model.requests = []
    model.recalled = {"skip": True}  # no recall on this run
    middleware = CtxrulesMiddleware(model="gpt-4o", window=WINDOW, state=tmp_path / "state", recall=False)
    agent = create_agent(model, tools=[run_job], middleware=[middleware], checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "t-1"}, "recursion_limit": 1000}
    state = asyncio.run(agent.ainvoke({"messages": [HumanMessage("Run the jobs.")]}, config))
    assert len(model.requests) == TURNS + 1
    _check_requests(model.requests, middleware)
    assert len([m for m in state["messages"] if isinstance(m, ToolMessage)]) == TURNS


def test_threads_are_sessions_named_by_the_id_rule(tmp_path: Path) -> None:
    middleware = CtxrulesMiddleware(model="gpt-4o", state=tmp_path / "state", recall=False)
    plain = middleware.session_for("run-42")
    odd = middleware.session_for("user@example.com/thread 7")
    assert plain.path == tmp_path / "state" / "run-42"
    assert re.fullmatch(r"[0-9a-f]{64}", odd.path.name)
    assert middleware.session_for(None).path.name == "default"
    assert middleware.session_for("run-42") is plain


@pytest.mark.parametrize("thread", ["injection.key", "Injection.KEY"])
def test_a_thread_named_as_the_state_roots_key_file_takes_nothing_of_the_root(tmp_path: Path, thread: str) -> None:
    """A thread id ``injection.key`` (chat apps pass user-chosen conversation ids) named the
    state root's key file as its session directory: the folder took the key's place, and every
    thread of the root failed on the key from then on. It is named by its sha256, as the
    store's other names are, and the other threads go on."""
    model = RecordingModel()
    model.requests = []
    model.recalled = {"skip": True}
    middleware = CtxrulesMiddleware(model="gpt-4o", state=tmp_path / "state", recall=False)
    agent = create_agent(model, tools=[], middleware=[middleware], checkpointer=InMemorySaver())
    for thread_id in (thread, "run-1", "run-2"):
        agent.invoke(
            {"messages": [HumanMessage("hi")]}, {"configurable": {"thread_id": thread_id}, "recursion_limit": 5}
        )
    assert (tmp_path / "state" / "injection.key").is_file()
    assert re.fullmatch(r"[0-9a-f]{64}", middleware.session_for(thread).path.name)
    assert (tmp_path / "state" / "run-1").is_dir() and (tmp_path / "state" / "run-2").is_dir()


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        ({"state": ""}, "state must not be empty (None is the default)"),
        ({"state": 5}, "state must be a string or a path, not int"),
        ({"session_id": None}, "session_id must be a non-empty string, not None"),
        ({"session_id": ""}, "session_id must be a non-empty string, not ''"),
        ({"session_id": 5}, "session_id must be a non-empty string, not 5"),
    ],
)
def test_arguments_of_the_wrong_kind_are_refused_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, arguments: dict[str, Any], said: str
) -> None:
    """``state=""`` (an unset variable) was the current directory: the key file and a session
    directory per thread went beside the application's own folders. A session id that is no
    text was a TypeError from deep inside."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CtxrulesError, match=re.escape(said)):
        CtxrulesMiddleware(model="gpt-4o", **arguments)
    assert list(tmp_path.iterdir()) == []


def test_a_thread_id_of_zero_is_its_own_session(tmp_path: Path) -> None:
    """A falsy thread id (the int 0) was taken for none: the run shared the default session with
    every run that has no thread id."""
    model = RecordingModel()
    model.requests = []
    model.recalled = {"skip": True}
    middleware = CtxrulesMiddleware(model="gpt-4o", state=tmp_path / "state", recall=False)
    agent = create_agent(model, tools=[], middleware=[middleware], checkpointer=InMemorySaver())
    agent.invoke({"messages": [HumanMessage("hi")]}, {"configurable": {"thread_id": 0}, "recursion_limit": 5})
    assert (tmp_path / "state" / "0").is_dir()
    assert not (tmp_path / "state" / "default").exists()


def test_open_sessions_are_bounded_and_a_let_go_one_reopens_from_its_state(tmp_path: Path) -> None:
    middleware = CtxrulesMiddleware(model="gpt-4o", state=tmp_path / "state", recall=False, max_sessions=2)
    first = middleware.session_for("a")
    history = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi, what now?"}]
    sent = first.prepare(history).messages
    middleware.session_for("b")
    middleware.session_for("c")  # "a" is the least recently used: let go
    assert middleware.session_for("c") is middleware.session_for("c")
    again = middleware.session_for("a")
    assert again is not first and again.path == first.path
    assert again.last_output() == sent  # what the session sent is read back from its state
    with pytest.raises(ValueError, match="max_sessions"):
        CtxrulesMiddleware(model="gpt-4o", state=tmp_path / "state", max_sessions=0)


def test_the_recall_tool_is_offered_from_the_first_call(tmp_path: Path) -> None:
    middleware = CtxrulesMiddleware(model="gpt-4o", state=tmp_path / "state")
    (recall,) = middleware.tools
    assert recall.name == "ctxrules_recall"
    schema = json.loads(json.dumps(recall.args_schema))
    assert schema["required"] == ["id"]


def test_a_recall_the_store_cannot_answer_is_the_tools_error_result(tmp_path: Path) -> None:
    """Not only a malformed call: a store that fails (Redis down) is the tool's error result
    with the reason, not an exception that ends the agent's run."""
    from ctxrules.stores.base import StoreError

    middleware = CtxrulesMiddleware(model="gpt-4o", state=tmp_path / "state")
    (recall,) = middleware.tools
    session = middleware.session_for(None)

    def down(arguments: Any) -> str:
        raise StoreError("[CR148] Redis at redis://localhost:1/0 is unreachable")

    session.recall = down  # type: ignore[method-assign]
    answer = recall.invoke({"id": "ab" * 32})
    assert "CR148" in answer and "unreachable" in answer
    del session.recall  # the real one again: a malformed call is an error result too
    assert "no marker of this conversation" in recall.invoke({"id": "ab" * 32, "lines": "9" * 5000})


def test_a_call_whose_arguments_did_not_parse_keeps_its_result(tmp_path: Path) -> None:
    """An AIMessage whose call is in ``invalid_tool_calls`` (arguments that are not JSON),
    answered by a ToolMessage: chat-model integrations send such calls as tool calls, so the
    result must stay with its call. It was removed as an orphan while the call stayed."""
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel

    seen: list[list[BaseMessage]] = []

    class Fake(GenericFakeChatModel):
        def bind_tools(self, tools: Any, **kwargs: Any) -> Fake:
            return self

        def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
            seen.append(list(messages))
            return super()._generate(messages, *args, **kwargs)

    broken = {"type": "invalid_tool_call", "id": "call_bad", "name": "run_job", "args": '{"n": ', "error": "JSON"}
    history = [
        HumanMessage("run job 1"),
        AIMessage("", invalid_tool_calls=[broken]),  # type: ignore[list-item]
        ToolMessage("error: the arguments were not valid JSON, try again", tool_call_id="call_bad"),
        HumanMessage("try again"),
    ]
    middleware = CtxrulesMiddleware(model="gpt-4o", state=tmp_path / "state", recall=False)
    model = Fake(messages=iter([AIMessage("done")]))
    agent = create_agent(model, tools=[run_job], middleware=[middleware], checkpointer=InMemorySaver())
    agent.invoke({"messages": history}, {"configurable": {"thread_id": "t"}})
    (sent,) = seen
    answered = [m.tool_call_id for m in sent if isinstance(m, ToolMessage)]
    calls = [c["id"] for m in sent if isinstance(m, AIMessage) for c in [*m.tool_calls, *m.invalid_tool_calls]]
    assert answered == ["call_bad"] and calls == ["call_bad"], sent


def _sent(middleware: CtxrulesMiddleware, messages: list[BaseMessage]) -> list[BaseMessage]:
    """What the model is handed for ``messages``, through the middleware's hook."""
    from langchain.agents.middleware.types import ModelRequest

    request = ModelRequest(
        model=None, messages=messages, system_message=None, tools=[], state={"messages": messages}, runtime=None
    )
    seen: list[Any] = []
    middleware.wrap_model_call(request, lambda prepared: seen.append(prepared) or AIMessage("ok"))
    return list(seen[0].messages)


def test_changed_messages_keep_their_own_ids_when_a_tool_call_id_is_reused(tmp_path: Path) -> None:
    """Two calls "c1": the pairing stage renames the second "c1_2" (with its result). The
    compacted first result kept the id of the *other* ToolMessage (the last one with "c1"), and
    the renamed one, and its AIMessage, lost theirs."""
    messages: list[BaseMessage] = [
        HumanMessage("Run job 1, then check the directory.", id="h1"),
        AIMessage("", id="a1", tool_calls=[{"id": "c1", "name": "run_job", "args": {"n": 1}}]),
        ToolMessage(big_output(1), tool_call_id="c1", id="tool-first"),
        AIMessage("", id="a2", tool_calls=[{"id": "c1", "name": "bash", "args": {"cmd": "pwd"}}]),
        ToolMessage("/work", tool_call_id="c1", id="tool-second"),
        HumanMessage("go on", id="h2"),
    ]
    middleware = CtxrulesMiddleware(model="gpt-4o", window=WINDOW, state=tmp_path / "state", recall=False)
    sent = _sent(middleware, messages)
    tools = [m for m in sent if isinstance(m, ToolMessage)]
    assert [m.id for m in tools] == ["tool-first", "tool-second"], sent
    assert [m.tool_call_id for m in tools] == ["c1", "c1_2"]
    assert "[ctxrules:elided" in tools[0].content and tools[0].content != messages[2].content  # compacted
    assistants = [m for m in sent if isinstance(m, AIMessage)]
    assert [m.id for m in assistants] == ["a1", "a2"]
    assert [c["id"] for m in assistants for c in m.tool_calls] == ["c1", "c1_2"]
    assert [m.id for m in sent if isinstance(m, HumanMessage)] == ["h1", "h2"]


def test_a_compacted_tool_result_keeps_its_error_status_and_artifact(tmp_path: Path) -> None:
    """A ToolMessage whose output the pack reduced was rebuilt from its OpenAI form, which has
    no status: an error result reached the model as a success (langchain-anthropic sends
    ``is_error`` from it), and its artifact was dropped."""
    messages: list[BaseMessage] = [
        HumanMessage("Run job 1.", id="h1"),
        AIMessage("", id="a1", tool_calls=[{"id": "c1", "name": "run_job", "args": {"n": 1}}]),
        ToolMessage(big_output(1), tool_call_id="c1", id="t1", status="error", artifact={"exit": 1}),
        AIMessage("", id="a2", tool_calls=[{"id": "c2", "name": "run_job", "args": {"n": 2}}]),
        ToolMessage(big_output(2), tool_call_id="c2", id="t2"),
        HumanMessage("go on", id="h2"),
    ]
    middleware = CtxrulesMiddleware(model="gpt-4o", window=64_000, state=tmp_path / "state", recall=False)
    sent = [m for m in _sent(middleware, messages) if isinstance(m, ToolMessage)]
    assert [m.id for m in sent] == ["t1", "t2"]
    assert "[ctxrules:elided" in sent[0].content  # compacted, so rebuilt
    assert [(m.status, m.artifact) for m in sent] == [("error", {"exit": 1}), ("success", None)]


def test_a_message_ctxrules_injects_takes_no_id_of_the_agents(tmp_path: Path) -> None:
    """The first "c1" call has no result (a user message came in between), the second one has:
    ctxrules answers the first with an interrupted result and renames the second "c1_2". The
    injected result took the real ToolMessage's id, and the real one was sent without it."""
    messages: list[BaseMessage] = [
        HumanMessage("list the files", id="h1"),
        AIMessage("", id="a1", tool_calls=[{"id": "c1", "name": "bash", "args": {"cmd": "ls"}}]),
        HumanMessage("wait, where are we?", id="h2"),
        AIMessage("", id="a2", tool_calls=[{"id": "c1", "name": "bash", "args": {"cmd": "pwd"}}]),
        ToolMessage("/work", tool_call_id="c1", id="tool-pwd"),
        HumanMessage("go on", id="h3"),
    ]
    middleware = CtxrulesMiddleware(model="gpt-4o", state=tmp_path / "state", recall=False)
    sent = _sent(middleware, messages)
    injected = [m for m in sent if is_injected(convert_to_openai_messages(m))]
    assert len(injected) == 1 and isinstance(injected[0], ToolMessage) and injected[0].id is None
    assert [(m.id, m.tool_call_id) for m in sent if isinstance(m, ToolMessage) and m not in injected] == [
        ("tool-pwd", "c1_2")
    ]
    assert [m.id for m in sent if m is not injected[0]] == ["h1", "a1", "h2", "a2", "tool-pwd", "h3"]


class ReusedIdModel(BaseChatModel):
    """Calls ``run_job`` with the same tool-call id ("c1") every turn for ``turns`` turns, then
    stops; records the messages of every request."""

    requests: list[list[BaseMessage]] = []  # noqa: RUF012 - a pydantic field, copied per instance
    turns: int = 10

    @property
    def _llm_type(self) -> str:
        return "reused-id-fake"

    def bind_tools(self, tools: Any, **kwargs: Any) -> ReusedIdModel:
        return self

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.requests.append(list(messages))
        turn = len(self.requests)
        if turn > self.turns:
            return ChatResult(generations=[ChatGeneration(message=AIMessage("All jobs ran."))])
        call = {"id": "c1", "name": "run_job", "args": {"n": turn}}
        return ChatResult(generations=[ChatGeneration(message=AIMessage(f"Running job {turn}.", tool_calls=[call]))])


def test_every_message_the_model_sees_has_the_id_of_the_state_message_it_stands_for(tmp_path: Path) -> None:
    """A model that reuses one tool-call id for every call, through LangChain's agent loop: the
    state keeps every message under a unique id, and in every request each message ctxrules did
    not inject carries the id of the state message it stands for (renamed "c1_<n>" and
    compacted ones too), no id twice."""
    model = ReusedIdModel()
    model.requests = []
    middleware = CtxrulesMiddleware(model="gpt-4o", window=60_000, state=tmp_path / "state", recall=False)
    agent = create_agent(
        model, tools=[run_job], middleware=[middleware], system_prompt="You run jobs.", checkpointer=InMemorySaver()
    )
    config = {"configurable": {"thread_id": "t-ids"}, "recursion_limit": 1000}
    state = agent.invoke({"messages": [HumanMessage("Run the jobs.")]}, config)
    assert len(model.requests) == model.turns + 1
    ids = [m.id for m in state["messages"]]
    assert None not in ids and len(set(ids)) == len(ids)
    jobs = [m for m in state["messages"] if isinstance(m, ToolMessage)]
    assert [m.tool_call_id for m in jobs] == ["c1"] * model.turns
    assert [m.content for m in jobs] == [big_output(n) for n in range(1, model.turns + 1)]  # verbatim
    by_id = {m.id: m for m in state["messages"]}
    renamed = compacted = 0
    for n, request in enumerate(model.requests, 1):
        sent = [m for m in request[1:] if not is_injected(convert_to_openai_messages(m))]  # [0]: the system prompt
        assert len({m.id for m in sent}) == len(sent), n
        for m in sent:
            original = by_id.get(m.id)  # type: ignore[arg-type]
            assert original is not None and type(original) is type(m), (n, m)
            assert str(m.content).splitlines()[:1] == str(original.content).splitlines()[:1], (n, m)
            if isinstance(m, ToolMessage):
                assert re.fullmatch(r"c1(_[0-9]+)?", m.tool_call_id), (n, m.tool_call_id)
                renamed += m.tool_call_id != "c1"
                compacted += m.content != original.content
    assert renamed >= model.turns and compacted >= model.turns, (renamed, compacted)


def test_messages_with_id_less_calls_keep_their_ids(tmp_path: Path) -> None:
    """LangChain allows a tool call with ``id=None``; the pairing stage gives it (and a result
    with an empty ``tool_call_id``) a derived id, so both messages changed. They were matched to
    their originals by call id, found none, and reached the model without their ids."""
    messages: list[BaseMessage] = [
        HumanMessage("Run job 1.", id="h1"),
        AIMessage("", id="a1", tool_calls=[{"id": None, "name": "run_job", "args": {"n": 1}}]),
        ToolMessage("done", tool_call_id="", id="t1"),
        AIMessage("", id="a2", tool_calls=[{"id": None, "name": "run_job", "args": {"n": 2}}]),
        HumanMessage("go on", id="h2"),
    ]
    middleware = CtxrulesMiddleware(model="gpt-4o", state=tmp_path / "state", recall=False)
    sent = _sent(middleware, messages)
    assert pairing_problems([convert_to_openai_messages(m) for m in sent]) == []
    own = [m for m in sent if not is_injected(convert_to_openai_messages(m))]
    assert [m.id for m in own] == ["h1", "a1", "t1", "a2", "h2"], sent
    calls = [c["id"] for m in own if isinstance(m, AIMessage) for c in m.tool_calls]
    assert len(set(calls)) == 2 and all(c.startswith("call_ctxrules_") for c in calls)
    assert [m.tool_call_id for m in own if isinstance(m, ToolMessage)] == calls[:1]


def _agent_calling_recall(middleware: CtxrulesMiddleware, arguments: dict[str, Any]) -> ToolMessage:
    """The result of one recall call with ``arguments`` that a model made in a real agent run."""
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel

    class Fake(GenericFakeChatModel):
        def bind_tools(self, tools: Any, **kwargs: Any) -> Fake:
            return self

    call = {"id": "call_1", "name": "ctxrules_recall", "args": arguments}
    model = Fake(messages=iter([AIMessage("", tool_calls=[call]), AIMessage("done")]))
    agent = create_agent(model, tools=[], middleware=[middleware], checkpointer=InMemorySaver())
    out = agent.invoke({"messages": [HumanMessage("hi")]}, {"configurable": {"thread_id": "t"}})
    (result,) = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    return result


@pytest.mark.parametrize(
    ("arguments", "reason"),
    [
        ({}, "give the id"),
        ({"lines": "1:2"}, "give the id"),
        ({"id": "x", "page": 2}, "'x' is not a vault id"),
    ],
)
def test_a_recall_call_without_an_id_or_with_a_key_of_its_own_is_an_error_result(
    tmp_path: Path, arguments: dict[str, Any], reason: str
) -> None:
    """The tool's schema is not enforced before the call: a model's call without ``id``, or
    with a key the schema does not name, was a TypeError that ended the agent's run."""
    middleware = CtxrulesMiddleware(model="gpt-4o", state=tmp_path / "state")
    result = _agent_calling_recall(middleware, arguments)
    assert result.status == "error" and reason in str(result.content), result


@pytest.mark.parametrize(
    ("message", "where"),
    [
        (ToolMessage([{"text": "no type"}], tool_call_id="a"), "message 2 (ToolMessage)"),
        (RemoveMessage(id="m1"), "message 2 (RemoveMessage)"),
    ],
)
def test_a_message_langchain_cannot_convert_is_a_messages_error_naming_it(
    tmp_path: Path, message: BaseMessage, where: str
) -> None:
    """LangChain's converter raised its own KeyError or ValueError from deep inside for these."""
    from ctxrules.errors import MessagesError

    middleware = CtxrulesMiddleware(model="gpt-4o", state=tmp_path / "state", recall=False)
    history = [HumanMessage("hi"), AIMessage("", tool_calls=[{"id": "a", "name": "run_job", "args": {}}]), message]
    with pytest.raises(MessagesError, match=re.escape(where) + ": LangChain cannot convert it"):
        _sent(middleware, history)


def test_standard_blocks_with_no_chat_completions_form_reach_the_model_as_they_are(tmp_path: Path) -> None:
    """LangChain v1's standard ``video``, ``text-plain`` and URL ``file`` blocks (what Gemini and
    Claude take) have no Chat Completions form: its converter refused them, and the middleware
    ended the agent's run with a MessagesError. They go through as opaque parts: an unchanged
    message is the agent's own object, and a compacted one keeps its blocks as they were."""
    video = {"type": "video", "url": "https://example.com/run.mp4"}
    pdf = {"type": "file", "url": "https://example.com/spec.pdf"}
    note = {"type": "text-plain", "text": "plain notes", "mime_type": "text/plain"}
    ask = HumanMessage([{"type": "text", "text": "Watch this, read that."}, video, pdf, note], id="h1")
    messages: list[BaseMessage] = [
        ask,
        AIMessage("", id="a1", tool_calls=[{"id": "c1", "name": "run_job", "args": {"n": 1}}]),
        ToolMessage([{"type": "text", "text": big_output(1)}, video], tool_call_id="c1", id="t1"),
        AIMessage("", id="a2", tool_calls=[{"id": "c2", "name": "run_job", "args": {"n": 2}}]),
        ToolMessage(big_output(2), tool_call_id="c2", id="t2"),
        HumanMessage("go on", id="h2"),
    ]
    middleware = CtxrulesMiddleware(model="gpt-4o", window=64_000, state=tmp_path / "state", recall=False)
    sent = _sent(middleware, messages)
    assert sent[0] is ask
    (compacted,) = [m for m in sent if isinstance(m, ToolMessage) and m.id == "t1"]
    assert isinstance(compacted.content, list) and compacted.content[-1] == video
    assert "[ctxrules:elided" in json.dumps(compacted.content)


@pytest.mark.parametrize(
    "options",
    [
        {"window": 0},
        {"window": "128000"},
        {"window": True},
        {"model": "not-a-model-ctxrules-knows"},
        {"model": "gpt\u202e4o"},
    ],
)
def test_a_window_or_model_no_call_can_use_is_refused_when_the_middleware_is_made(
    tmp_path: Path, options: dict[str, Any]
) -> None:
    """Accepted when the agent was built, they failed its first model call (and every one after
    it). Refused now as the litellm hook refuses them: the same error, the same message."""
    from ctxrules.integrations.litellm import ContextHook

    with pytest.raises(CtxrulesError) as by_the_hook:
        ContextHook("builtin:default", tmp_path / "hook", **{"model": "gpt-4o", **options})
    with pytest.raises(type(by_the_hook.value), match=re.escape(str(by_the_hook.value))):
        middleware = CtxrulesMiddleware("builtin:default", state=tmp_path / "state", **{"model": "gpt-4o", **options})
        create_agent(RecordingModel(), tools=[run_job], middleware=[middleware])
    assert not (tmp_path / "state").exists()


class OneAnswer(RecordingModel):
    """Answers at once, without a tool call."""

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        self.requests.append(list(messages))
        return ChatResult(generations=[ChatGeneration(message=AIMessage("Done."))])


def test_a_model_the_registry_does_not_know_is_taken_with_a_window(tmp_path: Path) -> None:
    middleware = CtxrulesMiddleware("builtin:default", model="my-own-model", window=32_000, state=tmp_path / "state")
    model = OneAnswer(requests=[])
    agent = create_agent(model, tools=[run_job], middleware=[middleware])
    agent.invoke({"messages": [HumanMessage("hi")]}, {"configurable": {"thread_id": "own"}})
    assert len(model.requests) == 1 and (tmp_path / "state" / "own" / "state.json").is_file()
