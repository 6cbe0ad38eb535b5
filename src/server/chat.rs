//! `POST /v1/chat/completions`: OpenAI's chat API (`messages`, `max_tokens` or
//! `max_completion_tokens`, `temperature`, `top_p`, `seed`, `stop`, `stream` as server-sent
//! events with `stream_options.include_usage`, `usage`) over the completions' one generation
//! path ([`super::completions`]): a chat request is a completion whose prompt is the
//! conversation ([`crate::service::request::Prompt::Chat`]), rendered by the model's chat
//! template with the messages' texts as text. A greedy request (`temperature` 0) with a model
//! decodes speculatively unless it says `"speculative": false`: the same tokens, sooner.

use super::api::ApiError;
use super::completions::{usage, Mode, Summary};
use super::openai::{ChatMessage, ChatRequest, Completion, Content};
use crate::service::chat::Message;
use crate::service::request::Prompt;
use serde_json::{json, Value};

impl ChatMessage {
    fn message(&self) -> Result<Message, ApiError> {
        let content = match &self.content {
            Content::Text(t) => t.clone(),
            Content::Parts(parts) => parts
                .iter()
                .map(|p| match (p["type"].as_str(), p["text"].as_str()) {
                    (Some("text"), Some(t)) => Ok(t),
                    _ => Err(ApiError::bad(format!(
                        "a message part {p} is not text: this server reads text parts only"
                    ))),
                })
                .collect::<Result<Vec<&str>, _>>()?
                .concat(),
        };
        let role = match self.role.as_str() {
            "developer" => "system",
            r @ ("system" | "user" | "assistant") => r,
            other => {
                return Err(ApiError::bad(format!(
                    "a message's role is system, user or assistant, not {other:?}"
                )))
            }
        };
        Ok(Message::new(role, &content))
    }
}

impl ChatRequest {
    /// The completion this chat asks for: its prompt the conversation, speculative by
    /// default when greedy and a model serves.
    pub fn completion(mut self, has_model: bool) -> Result<Completion, ApiError> {
        let trivial = |x: Option<f64>| x.is_none_or(|x| x == 0.0);
        if !trivial(self.frequency_penalty) || !trivial(self.presence_penalty) {
            return Err(ApiError::bad(
                "\"frequency_penalty\" and \"presence_penalty\" are not supported: leave them \
                 out or 0",
            ));
        }
        if self.logprobs == Some(true) {
            return Err(ApiError::bad(
                "\"logprobs\" are not returned by this server",
            ));
        }
        if self.messages.is_empty() {
            return Err(ApiError::bad("\"messages\" must hold at least one message"));
        }
        let messages = self
            .messages
            .iter()
            .map(ChatMessage::message)
            .collect::<Result<Vec<_>, _>>()?;
        let mut options = self.options();
        let greedy = options.temperature == Some(0.0);
        let mode = match (options.mode, has_model) {
            (Some(m), _) => m,
            (None, false) => {
                return Err(ApiError::bad(
                    "chat completions need a model: start the server with --model",
                ))
            }
            (None, true) if greedy && options.speculative != Some(false) => Mode::Speculative,
            (None, true) => Mode::Neural,
        };
        if mode == Mode::Sbis {
            return Err(ApiError::bad(
                "chat completions are the model's: mode \"sbis\" continues text, at \
                 /v1/completions",
            ));
        }
        options.mode = Some(mode);
        if mode == Mode::Speculative {
            options.speculative = None;
        }
        options.max_tokens = self.max_completion_tokens.or(options.max_tokens);
        Ok(Completion {
            prompt: Prompt::Chat {
                messages,
                parse_special: self.parse_special,
            },
            k: None,
            options,
        })
    }
}

/// The OpenAI chat completion object.
pub fn chat_json(id: &str, created: u64, model: &str, text: &str, summary: &Summary) -> Value {
    json!({
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": null,
            "finish_reason": summary.finish_reason,
        }],
        "usage": usage(summary),
        "infgram": summary.infgram,
    })
}

/// One chunk of a streamed chat completion: the assistant's role first, then text, then the
/// end (`finish_reason`, an empty delta).
pub fn chat_chunk(
    id: &str,
    created: u64,
    model: &str,
    delta: Value,
    finish_reason: Option<&str>,
) -> Value {
    json!({
        "id": id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{
            "index": 0,
            "delta": delta,
            "logprobs": null,
            "finish_reason": finish_reason,
        }],
    })
}

/// The last chunk of a stream that asked for its usage (`stream_options.include_usage`): no
/// choices, the usage and infgram's report.
pub fn usage_chunk(id: &str, created: u64, model: &str, summary: &Summary) -> Value {
    json!({
        "id": id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage(summary),
        "infgram": summary.infgram,
    })
}
