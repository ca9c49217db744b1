"""The Messages API's side of the team ``agentmend init`` scaffolds, for the fake API.

``answer_scaffolded_team`` is a ``FakeMessagesAPI`` responder: it answers the support agent with
the shop's policies and the summarizer with one ``Summary:`` line, so the scaffold's eval suites
pass when recorded against it. Every answer is counted in ``answered``.
"""

from __future__ import annotations

from fake_messages_api import RecordedRequest, Reply

SUPPORT_ANSWER = (
    "Refunds are possible within 30 days of delivery, to your original payment method. "
    "Returns are free with the label from your order page."
)
SUMMARY_ANSWER = "Summary: the customer asks for a refund or an address change."


def answer_scaffolded_team(request: RecordedRequest) -> Reply | None:
    """The answer of the scaffolded agent the request is for (by its system prompt)."""
    system = str(request.json.get("system") or "") if request.json else ""
    if "summarize a customer conversation" in system:
        return Reply.text(SUMMARY_ANSWER)
    if "customers of an online shop" in system:
        return Reply.text(SUPPORT_ANSWER)
    return None  # not the scaffold's: the fake API's fallback answers (an error by default)
