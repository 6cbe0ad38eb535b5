//! `infgram serve`: the infini-gram HTTP API and an OpenAI-style generation API over the
//! service layer (feature `server`: axum on tokio, connections served by hyper).
//!
//! * `POST /` — the infini-gram API ([`api`]): `{"index", "query_type", "query" |
//!   "query_ids", ...}` → [`crate::service::query::execute_within`] plus `latency`, `token_ids`, `tokens`.
//!   Queries run on tokio's blocking pool (at most [`Limits::concurrent_queries`] at once), so
//!   a slow one never holds an I/O thread.
//! * `POST /v1/completions` — generation ([`completions`]) on one worker thread with a bounded
//!   queue; streamed as server-sent events with `"stream": true`.
//! * `POST /v1/drafts` — drafts for another engine's speculative loop ([`drafts`]): the
//!   drafters of speculative decoding over a served index, a session per `request_id`.
//! * `GET /health`, `GET /metrics` (Prometheus text, [`metrics`]), `GET /v1/models`.
//!
//! Every refusal is `{"error": MESSAGE}` with a 4xx status. Limits ([`Limits`]) bound the body,
//! the query, the work of one query and the time a request or a slow client may take. One
//! line per request goes to stderr (unless `log_requests` is off). SIGINT or SIGTERM stops
//! accepting connections and lets the open ones finish (for at most [`SHUTDOWN_GRACE`]).

/// The infini-gram API's shapes (moved into the service: Python answers them without a server).
pub use crate::service::api;
pub mod chat;
pub mod completions;
pub mod drafts;
pub mod metrics;
pub mod openai;
pub mod origin;

use crate::service::models::ModelOptions;
use crate::service::query::QueryLimits;
use api::{read_request, ApiError};
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use completions::{completion_json, unix_seconds, Event, Generator};
use metrics::Metrics;
use openai::{ChatRequest, Completion, CompletionRequest};
use serde_json::{json, Value};
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long open connections may take to finish after a shutdown signal.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// What the server accepts; each is a clear 4xx when passed.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Request body, in bytes (413 past it).
    pub body_bytes: usize,
    /// The bounds of an infini-gram API query, checked by the library
    /// ([`crate::service::query::Query::check`]): characters of a query string (infini-gram's
    /// API: 1,000), its tokens (500), `maxnum`, `max_disp_len` and `max_diff_tokens` at most.
    pub query: QueryLimits,
    /// Characters of a completion prompt.
    pub prompt_chars: usize,
    /// Tokens of a completion prompt.
    pub prompt_tokens: usize,
    /// `max_tokens` of a completion at most.
    pub max_tokens: usize,
    /// Time a query may take (408 past it).
    pub query_time: Duration,
    /// Time a generation may take (it ends there, `finish_reason: "length"`).
    pub generation_time: Duration,
    /// Time a client has to send a request's headers, and its body.
    pub client_time: Duration,
    /// Generations waiting at most (429 past it).
    pub backlog: usize,
    /// Generations run at once at most: with a model whose backend holds several sequences
    /// (the native one, on the CPU or a GPU), their tokens share the model's passes
    /// ([`crate::service::models::Batcher`]);
    /// without a model, SBIS generations run side by side. Each answer is the one the
    /// request gets alone. 0: chosen when the model is loaded ([`Generator`]'s rule:
    /// the rows its passes still pay for, as many full-length requests as the KV cache
    /// bytes hold).
    pub parallel: usize,
    /// Bytes of KV cache the running generations may hold together: a generation holds what
    /// its prompt and `max_tokens` may need before it runs (it waits while the others leave
    /// too little), and one that could never fit is answered 413.
    pub kv_cache_bytes: usize,
    /// Bytes of KV cache kept of ended generations (prompt caching, with a batched model):
    /// a request whose tokens start with a kept generation's reads only the rest; the oldest
    /// go past it; 0: none kept ([`crate::service::models::Batcher::keep_prompts`]).
    pub prompt_cache_bytes: usize,
    /// Queries running at once at most (more wait their turn).
    pub concurrent_queries: usize,
    /// Tokens of past outputs the model's generations draft from (speculative mode); the
    /// oldest go past it; 0: none kept.
    pub past_output_tokens: usize,
    /// Bytes the drafting sessions of `POST /v1/drafts` may hold, all indexes together; past
    /// it the least recently used end (as past [`crate::service::drafts::MAX_SESSIONS`]).
    pub draft_session_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            body_bytes: 64 * 1024,
            query: QueryLimits::SERVED,
            prompt_chars: 20_000,
            prompt_tokens: 4096,
            max_tokens: 2048,
            query_time: Duration::from_secs(10),
            generation_time: completions::DEFAULT_GENERATION_TIME,
            client_time: Duration::from_secs(10),
            backlog: 8,
            parallel: 4,
            kv_cache_bytes: 4 << 30,
            prompt_cache_bytes: crate::service::models::Batcher::KEPT_BYTES,
            concurrent_queries: 64,
            past_output_tokens: crate::service::run::PAST_OUTPUTS_BUDGET,
            draft_session_bytes: crate::service::drafts::DEFAULT_SESSION_BYTES,
        }
    }
}

/// What to serve, where, and within which limits.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Address to listen on (port 0: any free port).
    pub addr: SocketAddr,
    /// Indexes by name.
    pub indexes: Vec<(String, PathBuf)>,
    /// Tokenizers by index name, for indexes that do not record theirs (infini-gram's u16 /
    /// u32 indexes) or to name another file of the same tokenizer; the others use their own.
    pub tokenizers: Vec<(String, String)>,
    /// A neural model for `/v1/completions` (as `gen --model` takes it).
    pub model: Option<String>,
    /// How the model is loaded.
    pub model_options: ModelOptions,
    /// The limits.
    pub limits: Limits,
    /// One line per request on stderr.
    pub log_requests: bool,
    /// Where the model's past outputs are kept across restarts (none: in memory only).
    pub past_outputs_file: Option<PathBuf>,
    /// How `POST /v1/drafts` drafts from a corpus (a completion names its own rule).
    pub corpus_rule: crate::service::request::CorpusRule,
    /// Host names the server answers to beside IP addresses and `localhost` ([`origin`]).
    pub allowed_hosts: Vec<String>,
}

pub use crate::service::catalog::{CheckState, FullCheck, Indexes, Served};

/// Everything the handlers share.
struct AppState {
    indexes: Indexes,
    limits: Limits,
    metrics: Metrics,
    generator: Generator,
    queries: tokio::sync::Semaphore,
    log_requests: bool,
    started: Instant,
    completions: AtomicU64,
    drafts: drafts::DraftService,
    hosts: origin::AllowedHosts,
}

/// The endpoint a response answered, for metrics and the log (set by the handlers).
#[derive(Clone, Copy)]
struct Endpoint(&'static str);

/// A bound server, ready to run.
pub struct Server {
    listener: tokio::net::TcpListener,
    router: Router,
    state: Arc<AppState>,
}

impl Server {
    /// Opens the indexes, loads the model (on the generation thread) and binds the address.
    pub async fn bind(config: ServerConfig) -> crate::error::Result<Server> {
        let (state, router) = app(&config)?;
        let listener = tokio::net::TcpListener::bind(config.addr)
            .await
            .map_err(|e| {
                crate::error::Error::input(format!(
                    "cannot listen on {}: {e} (is another server on that port? try --addr \
                     127.0.0.1:0 for any free port)",
                    config.addr
                ))
            })?;
        Ok(Server {
            listener,
            router,
            state,
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// The model the server generates with, if any.
    pub fn model_name(&self) -> Option<&str> {
        self.state.generator.model_name.as_deref()
    }

    /// Generations it runs at once (`Limits::parallel`, or the number chosen for its model).
    pub fn parallel(&self) -> usize {
        self.state.generator.parallel()
    }

    /// Serves until `shutdown` resolves, then lets open connections finish (for at most
    /// [`SHUTDOWN_GRACE`]).
    pub async fn run(
        self,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> crate::error::Result<()> {
        use hyper_util::rt::{TokioIo, TokioTimer};
        let graceful = hyper_util::server::graceful::GracefulShutdown::new();
        let client_time = self.state.limits.client_time;
        tokio::pin!(shutdown);
        loop {
            let (stream, _peer) = tokio::select! {
                accepted = self.listener.accept() => match accepted {
                    Ok(conn) => conn,
                    // Out of descriptors, a reset before accept: wait a little, go on.
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                },
                () = &mut shutdown => break,
            };
            let _ = stream.set_nodelay(true);
            let router = self.router.clone();
            let service = hyper::service::service_fn(move |req: hyper::Request<_>| {
                tower::ServiceExt::oneshot(router.clone(), req)
            });
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(client_time)
                .keep_alive(true);
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            let conn = graceful.watch(conn);
            tokio::spawn(async move {
                let _ = conn.await;
            });
        }
        drop(self.listener);
        let _ = tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown()).await;
        Ok(())
    }
}

/// Runs a server on a new tokio runtime until SIGINT or SIGTERM; `ready` is told the address
/// once it listens.
pub fn serve(config: ServerConfig, ready: impl FnOnce(&Server)) -> crate::error::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| crate::error::Error::input(format!("cannot start the async runtime: {e}")))?;
    let served = runtime.block_on(async move {
        let server = Server::bind(config).await?;
        // The handlers are in place before anyone is told the address: a SIGTERM that comes
        // right after stops the server gracefully instead of killing it.
        let shutdown = shutdown_signal();
        ready(&server);
        server.run(shutdown).await
    });
    // Work still running on the blocking pool past the grace period is not waited for.
    runtime.shutdown_timeout(Duration::from_secs(1));
    // A save of the past outputs that the exit cuts short leaves no temporary file.
    crate::service::build::remove_unfinished();
    served
}

/// Installs the SIGINT (Ctrl-C) and SIGTERM handlers now, and returns what resolves when one of
/// them comes.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let interrupt = signal(SignalKind::interrupt());
        let term = signal(SignalKind::terminate());
        async move {
            match (interrupt, term) {
                (Ok(mut interrupt), Ok(mut term)) => {
                    tokio::select! {
                        _ = interrupt.recv() => {},
                        _ = term.recv() => {},
                    }
                }
                (Ok(mut one), Err(_)) | (Err(_), Ok(mut one)) => {
                    one.recv().await;
                }
                (Err(_), Err(_)) => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
    }
    #[cfg(not(unix))]
    {
        async move {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// The routes of a server for `config` (its indexes opened, its generation worker started),
/// without a listener: what the router's fuzz target sends requests to, end to end.
pub fn router_for(config: &ServerConfig) -> crate::error::Result<Router> {
    app(config).map(|(_, router)| router)
}

/// The server's state and routes for `config`: what [`Server::bind`] serves.
fn app(config: &ServerConfig) -> crate::error::Result<(Arc<AppState>, Router)> {
    #[cfg(feature = "neural")]
    if config.model.is_some() {
        crate::service::models::check_device(&config.model_options)?;
    }
    let indexes = Indexes::open(&config.indexes, &config.tokenizers)?;
    let generator = Generator::start(
        config.model.as_deref(),
        &config.model_options,
        &config.limits,
        config.past_outputs_file.as_deref(),
    )?;
    let generator_past = generator.past_store();
    let state = Arc::new(AppState {
        indexes,
        queries: tokio::sync::Semaphore::new(config.limits.concurrent_queries.max(1)),
        limits: config.limits.clone(),
        metrics: Metrics::default(),
        generator,
        log_requests: config.log_requests,
        started: Instant::now(),
        completions: AtomicU64::new(0),
        drafts: drafts::DraftService::new(
            generator_past,
            config.corpus_rule,
            config.limits.draft_session_bytes,
        ),
        hosts: origin::AllowedHosts::new(&config.allowed_hosts),
    });
    let router = router(state.clone());
    Ok((state, router))
}

/// The routes, with the body limit, the body read timeout, and the logging / metrics layer.
fn router(state: Arc<AppState>) -> Router {
    let limits = &state.limits;
    Router::new()
        .route("/", post(query))
        .route("/v1/completions", post(completions_handler))
        .route("/v1/chat/completions", post(chat_handler))
        .route("/v1/drafts", post(drafts_handler))
        .route("/health", get(health))
        .route("/metrics", get(metrics_handler))
        .route("/v1/models", get(models))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::extract::DefaultBodyLimit::max(limits.body_bytes))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            whole_body_in_time,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            check_origin,
        ))
        .layer(axum::middleware::from_fn_with_state(state.clone(), observe))
        .with_state(state)
}

/// Refuses requests from other sites' web pages and JSON routes' bodies of other types
/// ([`origin`]) before anything is read.
async fn check_origin(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let json_route = req.method() == axum::http::Method::POST;
    match state.hosts.check(req.headers(), json_route) {
        Ok(()) => next.run(req).await,
        Err(e) => {
            let mut response = refusal(req.uri().path(), &e);
            response.headers_mut().insert(
                header::CONNECTION,
                header::HeaderValue::from_static("close"),
            );
            response
        }
    }
}

/// Reads a request's whole body before its handler runs, within `--client-timeout` counted
/// from the start of the body (not from the last byte: a client that sends a byte now and then
/// cannot hold a connection) and within `--max-body`; past either the request is answered 408
/// or 413 and the connection closed.
async fn whole_body_in_time(
    State(state): State<Arc<AppState>>,
    req: Request,
    next: Next,
) -> Response {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_string();
    let limits = &state.limits;
    let read = axum::body::to_bytes(body, limits.body_bytes);
    let refused = match tokio::time::timeout(limits.client_time, read).await {
        Ok(Ok(bytes)) => {
            let req = Request::from_parts(parts, axum::body::Body::from(bytes));
            return next.run(req).await;
        }
        Ok(Err(e)) => {
            let too_large = std::iter::successors(std::error::Error::source(&e), |c| c.source())
                .any(|c| c.is::<http_body_util::LengthLimitError>());
            if too_large {
                body_too_large()
            } else {
                ApiError::bad(format!("cannot read the request body: {e}"))
            }
        }
        Err(_) => ApiError {
            status: 408,
            message: format!(
                "the request body did not arrive within {:.1} s (--client-timeout)",
                limits.client_time.as_secs_f64()
            ),
        },
    };
    let mut response = refusal(&path, &refused);
    response.headers_mut().insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    response
}

/// A refusal before a request reaches its handler, in the shape of the route it asked for:
/// OpenAI's error object on the chat route, `{"error": MESSAGE}` elsewhere.
fn refusal(path: &str, e: &ApiError) -> Response {
    match path {
        "/v1/chat/completions" => Shape::Chat {
            include_usage: false,
        }
        .error(e),
        _ => error_response("other", e),
    }
}

/// Records every request in the metrics and (unless turned off) logs one line for it; a
/// request whose client left before its answer (the connection closed, the handler dropped)
/// is recorded as status 499, as nginx logs it.
async fn observe(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let mut seen = Seen {
        state: state.clone(),
        started: Instant::now(),
        method: req.method().to_string(),
        path: req.uri().path().to_string(),
        answered: false,
    };
    let response = next.run(req).await;
    seen.answered = true;
    let endpoint = response
        .extensions()
        .get::<Endpoint>()
        .map_or("other", |e| e.0);
    seen.record(endpoint, response.status().as_u16());
    response
}

/// A request being answered, recorded when its answer is ready or when it is dropped
/// unanswered.
struct Seen {
    state: Arc<AppState>,
    started: Instant,
    method: String,
    path: String,
    answered: bool,
}

/// Status of a request whose client closed the connection before the answer (nginx's).
const CLIENT_LEFT: u16 = 499;

impl Seen {
    fn record(&self, endpoint: &str, status: u16) {
        let seconds = self.started.elapsed().as_secs_f64();
        self.state.metrics.record(endpoint, status, seconds);
        if self.state.log_requests {
            let line = format!(
                "{:.3} {} {} {status} {endpoint} {:.3} ms\n",
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0.0, |d| d.as_secs_f64()),
                self.method,
                self.path,
                seconds * 1e3
            );
            let _ = std::io::stderr().lock().write_all(line.as_bytes());
        }
    }
}

impl Drop for Seen {
    fn drop(&mut self) {
        if !self.answered {
            let endpoint = match self.path.as_str() {
                "/v1/completions" => "completions",
                "/v1/chat/completions" => "completions",
                "/v1/drafts" => "drafts",
                _ => "other",
            };
            self.record(endpoint, CLIENT_LEFT);
        }
    }
}

/// A JSON response tagged with its endpoint.
fn json_response(endpoint: &'static str, status: u16, body: &Value) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut r = (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response();
    r.extensions_mut().insert(Endpoint(endpoint));
    r
}

/// `{"error": message}` with the error's status.
fn error_response(endpoint: &'static str, e: &ApiError) -> Response {
    json_response(endpoint, e.status, &json!({ "error": e.message }))
}

/// A body the server could not read (too large, too slow, cut off).
fn body_error(rejection: &BytesRejection) -> ApiError {
    if rejection.status().as_u16() == 413 {
        return body_too_large();
    }
    ApiError {
        status: rejection.status().as_u16(),
        message: format!("cannot read the request body: {}", rejection.body_text()),
    }
}

/// The 413 of a body past `--max-body`.
fn body_too_large() -> ApiError {
    ApiError {
        status: 413,
        message: "the request body is larger than this server accepts (--max-body)".into(),
    }
}

/// `POST /`: one infini-gram API query.
async fn query(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body = match body {
        Ok(b) => b,
        Err(rejection) => return error_response("other", &body_error(&rejection)),
    };
    let request = match read_request(&body, &state.limits.query) {
        Ok(r) => r,
        Err(e) => return error_response("other", &e),
    };
    let endpoint = request.query_type;
    match answer_query(&state, request).await {
        Ok(v) => json_response(endpoint, 200, &v),
        Err(e) => error_response(endpoint, &e),
    }
}

/// Runs a query on the blocking pool, within the time limit.
async fn answer_query(state: &Arc<AppState>, request: api::ApiQuery) -> Result<Value, ApiError> {
    let served = state.indexes.get(request.index.as_deref())?;
    let _permit = state
        .queries
        .acquire()
        .await
        .map_err(|_| ApiError::bad("the server is shutting down"))?;
    let limits = state.limits.query;
    let task = tokio::task::spawn_blocking(move || {
        api::answer(&served.index, served.tokenizer.as_ref(), &request, &limits)
    });
    match tokio::time::timeout(state.limits.query_time, task).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(_panicked)) => Err(ApiError {
            status: 500,
            message: "the query failed inside the engine (a bug: please report it with the \
                      request)"
                .into(),
        }),
        Err(_) => Err(ApiError {
            status: 408,
            message: format!(
                "the query took longer than this server's limit of {:.1} s (--query-timeout)",
                state.limits.query_time.as_secs_f64()
            ),
        }),
    }
}

/// `POST /v1/drafts`: a draft for an engine's request ([`drafts`]), on the blocking pool.
async fn drafts_handler(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    const ENDPOINT: &str = "drafts";
    let body = match body {
        Ok(b) => b,
        Err(rejection) => return error_response(ENDPOINT, &body_error(&rejection)),
    };
    let task_state = state.clone();
    let task = tokio::task::spawn_blocking(move || {
        task_state
            .drafts
            .answer(&task_state.indexes, &body, &task_state.limits)
    });
    match tokio::time::timeout(state.limits.query_time, task).await {
        Ok(Ok(Ok(v))) => json_response(ENDPOINT, 200, &v),
        Ok(Ok(Err(e))) => error_response(ENDPOINT, &e),
        Ok(Err(_panicked)) => error_response(
            ENDPOINT,
            &ApiError {
                status: 500,
                message: "drafting failed inside the engine (a bug: please report it with the \
                          request)"
                    .into(),
            },
        ),
        Err(_) => error_response(
            ENDPOINT,
            &ApiError {
                status: 408,
                message: format!(
                    "drafting took longer than {:?}; ask for fewer tokens",
                    state.limits.query_time
                ),
            },
        ),
    }
}

/// `POST /v1/completions`.
async fn completions_handler(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    const ENDPOINT: &str = "completions";
    let body = match body {
        Ok(b) => b,
        Err(rejection) => return error_response(ENDPOINT, &body_error(&rejection)),
    };
    match serde_json::from_slice::<CompletionRequest>(&body) {
        Ok(req) => complete(state, req.completion(), Shape::Text).await,
        Err(e) => error_response(
            ENDPOINT,
            &ApiError::bad(format!("not a completion request: {e}")),
        ),
    }
}

/// `POST /v1/chat/completions` ([`chat`]): a completion of a conversation.
async fn chat_handler(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let chat = Shape::Chat {
        include_usage: false,
    };
    let body = match body {
        Ok(b) => b,
        Err(rejection) => return chat.error(&body_error(&rejection)),
    };
    let req = match serde_json::from_slice::<ChatRequest>(&body) {
        Ok(req) => req,
        Err(e) => {
            return chat.error(&ApiError::bad(format!(
                "not a chat completion request: {e}"
            )))
        }
    };
    let include_usage = req.stream_options.as_ref().is_some_and(|o| o.include_usage);
    match req.completion(state.generator.model_name.is_some()) {
        Ok(req) => complete(state, req, Shape::Chat { include_usage }).await,
        Err(e) => Shape::Chat { include_usage }.error(&e),
    }
}

/// The OpenAI object a generation is answered as.
#[derive(Clone, Copy)]
enum Shape {
    /// A text completion (`/v1/completions`).
    Text,
    /// A chat completion; streamed, with a last usage chunk when asked for.
    Chat { include_usage: bool },
}

impl Shape {
    /// A refusal as this shape's clients read it: `{"error": MESSAGE}` for a text completion
    /// (as every route of this server), OpenAI's error object for a chat (what its clients
    /// show: `{"error": {"message", "type", "param", "code"}}`).
    fn error(self, e: &ApiError) -> Response {
        json_response("completions", e.status, &self.error_body(e))
    }

    /// The body of a refusal in this shape (also the event that ends a stream cut short).
    fn error_body(self, e: &ApiError) -> Value {
        match self {
            Shape::Text => json!({ "error": e.message }),
            Shape::Chat { .. } => {
                let kind = match e.status {
                    500.. => "server_error",
                    _ => "invalid_request_error",
                };
                json!({"error": {
                    "message": e.message, "type": kind, "param": null, "code": null
                }})
            }
        }
    }
}

/// A generation answered in `shape`, whole or streamed as server-sent events.
async fn complete(state: Arc<AppState>, req: Completion, shape: Shape) -> Response {
    const ENDPOINT: &str = "completions";
    let stream = req.options.stream;
    // Rendering a chat template and tokenizing a prompt take the blocking pool, never an I/O
    // thread: a slow one holds neither `/health` nor the shutdown signal.
    let task_state = state.clone();
    let submitted = tokio::task::spawn_blocking(move || {
        task_state
            .generator
            .submit(req, &task_state.indexes, &task_state.limits)
    })
    .await;
    let (events, mode) = match submitted {
        Ok(Ok(x)) => x,
        Ok(Err(e)) => return shape.error(&e),
        Err(_panicked) => {
            return shape.error(&ApiError {
                status: 500,
                message: "reading the prompt failed inside the engine (a bug: please report it \
                          with the request)"
                    .into(),
            })
        }
    };
    let n = state.completions.fetch_add(1, Relaxed);
    let id = match shape {
        Shape::Text => format!("cmpl-{n}"),
        Shape::Chat { .. } => format!("chatcmpl-{n}"),
    };
    let created = unix_seconds();
    let model = match (&state.generator.model_name, mode) {
        (Some(m), m2) if m2 != completions::Mode::Sbis => m.clone(),
        _ => "infgram-sbis".to_string(),
    };
    let answer = Answer {
        id,
        created,
        model,
        shape,
    };
    if stream {
        return streamed(answer, events);
    }
    let mut events = events;
    let mut text = String::new();
    while let Some(event) = events.recv().await {
        match event {
            Event::Text(t) => text.push_str(&t),
            Event::Done(Ok(s)) => return json_response(ENDPOINT, 200, &answer.whole(&text, &s)),
            Event::Done(Err(e)) => return shape.error(&e),
        }
    }
    shape.error(&ApiError {
        status: 503,
        message: "the generation worker stopped before the end".into(),
    })
}

/// What every object of one answer carries.
#[derive(Clone)]
struct Answer {
    id: String,
    created: u64,
    model: String,
    shape: Shape,
}

impl Answer {
    /// The whole answer.
    fn whole(&self, text: &str, s: &completions::Summary) -> Value {
        let (id, created, model) = (&self.id, self.created, &self.model);
        match self.shape {
            Shape::Text => {
                completion_json(id, created, model, text, Some(s.finish_reason), Some(s))
            }
            Shape::Chat { .. } => chat::chat_json(id, created, model, text, s),
        }
    }

    /// The events of `text` (the first of a chat also opens the assistant's message).
    fn text_events(&self, text: &str, first: bool) -> String {
        let (id, created, model) = (&self.id, self.created, &self.model);
        match self.shape {
            Shape::Text => sse(&completion_json(id, created, model, text, None, None)),
            Shape::Chat { .. } => {
                let mut out = String::new();
                if first {
                    let role = json!({"role": "assistant", "content": ""});
                    out.push_str(&sse(&chat::chat_chunk(id, created, model, role, None)));
                }
                if !text.is_empty() {
                    let delta = json!({ "content": text });
                    out.push_str(&sse(&chat::chat_chunk(id, created, model, delta, None)));
                }
                out
            }
        }
    }

    /// The events that end a stream.
    fn end_events(&self, s: &completions::Summary, first: bool) -> String {
        let (id, created, model) = (&self.id, self.created, &self.model);
        let reason = Some(s.finish_reason);
        let last = match self.shape {
            Shape::Text => sse(&completion_json(id, created, model, "", reason, Some(s))),
            Shape::Chat { include_usage } => {
                let mut out = self.text_events("", first);
                out.push_str(&sse(&chat::chat_chunk(
                    id,
                    created,
                    model,
                    json!({}),
                    reason,
                )));
                if include_usage {
                    out.push_str(&sse(&chat::usage_chunk(id, created, model, s)));
                }
                out
            }
        };
        format!("{last}data: [DONE]\n\n")
    }
}

/// An answer streamed as server-sent events, one per piece of text as it comes.
fn streamed(answer: Answer, events: tokio::sync::mpsc::UnboundedReceiver<Event>) -> Response {
    let body = futures_util::stream::unfold(
        (events, false, true),
        move |(mut events, finished, first)| {
            let answer = answer.clone();
            async move {
                if finished {
                    return None;
                }
                let (chunk, finished) = match events.recv().await {
                    Some(Event::Text(t)) => (answer.text_events(&t, first), false),
                    Some(Event::Done(Ok(s))) => (answer.end_events(&s, first), true),
                    Some(Event::Done(Err(e))) => (
                        format!("{}data: [DONE]\n\n", sse(&answer.shape.error_body(&e))),
                        true,
                    ),
                    None => return None,
                };
                Some((
                    Ok::<_, std::convert::Infallible>(chunk),
                    (events, finished, false),
                ))
            }
        },
    );
    let mut r = (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(body),
    )
        .into_response();
    r.extensions_mut().insert(Endpoint("completions"));
    r
}

/// One server-sent event carrying `v`.
fn sse(v: &Value) -> String {
    format!("data: {v}\n\n")
}

/// `GET /health`: the indexes, the model, the queue.
async fn health(State(state): State<Arc<AppState>>) -> Response {
    let indexes: Vec<Value> = state
        .indexes
        .iter()
        .map(|s| {
            let h = s.index.header();
            json!({
                "name": s.name,
                "tokens": s.index.total_tokens(),
                "shards": s.index.shards().len(),
                "tokenizer": h.tokenizer.kind,
                "full_check": match s.check.state() {
                    CheckState::Running => "running".to_string(),
                    CheckState::Passed => "passed".to_string(),
                    CheckState::Failed(what) => format!("failed: {what}"),
                },
            })
        })
        .collect();
    // A stopped generation worker, or an index that failed its full check, is a failing
    // server: completions, or that index's queries, would answer 503.
    let worker = state.generator.is_running();
    let failed = state
        .indexes
        .iter()
        .any(|s| matches!(s.check.state(), CheckState::Failed(_)));
    // Past outputs that cannot be saved are lost at the next restart: not ok either.
    let unsaved = state.generator.past_outputs_unsaved();
    let ok = worker && !failed && unsaved.is_none();
    let v = json!({
        "status": if ok { "ok" } else { "degraded" },
        "generation_worker": if worker { "running" } else { "stopped" },
        "indexes": indexes,
        "model": state.generator.model_name,
        "generation_waiting": state.generator.waiting(),
        "generation_running": state.generator.running_jobs(),
        "parallel": state.generator.parallel(),
        "kv_cache_bytes_held": state.generator.cache_budget().held(),
        "past_outputs": state.generator.past_output_stats(),
        "past_outputs_not_saved": unsaved,
        "uptime_seconds": state.started.elapsed().as_secs_f64(),
        "requests": state.metrics.total_requests(),
    });
    json_response("health", if ok { 200 } else { 503 }, &v)
}

/// `GET /metrics`: Prometheus text.
async fn metrics_handler(State(state): State<Arc<AppState>>) -> Response {
    let text = state.metrics.render(&[
        (
            "infgram_generation_waiting",
            "Generations waiting for the worker.",
            state.generator.waiting() as f64,
        ),
        (
            "infgram_generation_running",
            "Generations running now (at most --parallel).",
            state.generator.running_jobs() as f64,
        ),
        (
            "infgram_kv_cache_bytes_held",
            "KV cache bytes the running generations hold (what their prompts and max_tokens may need).",
            state.generator.cache_budget().held() as f64,
        ),
        (
            "infgram_batch_passes_total",
            "Passes of the model over the new tokens of the generations running (one or more each).",
            state.generator.batch_stats().passes.load(Relaxed) as f64,
        ),
        (
            "infgram_batch_sequences_total",
            "Generations those passes took, summed (over the passes: the mean batch).",
            state.generator.batch_stats().sequences.load(Relaxed) as f64,
        ),
        (
            "infgram_generated_tokens_total",
            "Tokens the generations wrote.",
            state.generator.tokens().generated_total() as f64,
        ),
        (
            "infgram_prompt_tokens_read_total",
            "Prompt tokens the model read (those a kept cache held excluded).",
            state.generator.tokens().read_total() as f64,
        ),
        (
            "infgram_generated_tokens_per_second",
            "Tokens the generations wrote a second, over the last ten whole seconds.",
            state.generator.tokens().per_second(),
        ),
        (
            "infgram_prompt_cache_tokens",
            "Tokens the kept caches of ended generations hold (bounded by --prompt-cache-mib).",
            state.generator.batch_stats().kept_tokens.load(Relaxed) as f64,
        ),
        (
            "infgram_prompt_cache_reused_tokens_total",
            "Prompt tokens not read again because a kept cache held them.",
            state.generator.batch_stats().reused_tokens.load(Relaxed) as f64,
        ),
        (
            "infgram_uptime_seconds",
            "Seconds since the server started.",
            state.started.elapsed().as_secs_f64(),
        ),
        (
            "infgram_index_opens_total",
            "Index directories opened by this process (at start; a request opens none).",
            crate::service::indexes::opens_so_far() as f64,
        ),
        (
            "infgram_draft_sessions",
            "Drafting sessions open (POST /v1/drafts with a request_id).",
            state.drafts.store().open() as f64,
        ),
        (
            "infgram_draft_session_bytes",
            "Bytes the drafting sessions hold (bounded by --draft-session-bytes).",
            state.drafts.store().bytes() as f64,
        ),
        (
            "infgram_draft_sessions_dropped_total",
            "Drafting sessions ended as the least recently used past the sessions' bounds.",
            state.drafts.store().dropped() as f64,
        ),
        (
            "infgram_tokenizer_checks_total",
            "Checks that an index was built with the tokenizer it is used with (one per \
             index a completion binds).",
            crate::service::indexes::checks_so_far() as f64,
        ),
    ]);
    let mut r = ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response();
    r.extensions_mut().insert(Endpoint("metrics"));
    r
}

/// `GET /v1/models`: the one model (or the ∞-gram alone), in OpenAI's list shape.
async fn models(State(state): State<Arc<AppState>>) -> Response {
    let id = state
        .generator
        .model_name
        .clone()
        .unwrap_or_else(|| "infgram-sbis".into());
    let v = json!({
        "object": "list",
        "data": [{ "id": id, "object": "model", "created": 0, "owned_by": "infgram" }],
    });
    json_response("models", 200, &v)
}

/// Any other path.
async fn not_found(req: Request) -> Response {
    error_response(
        "other",
        &ApiError {
            status: 404,
            message: format!(
                "no endpoint {}: POST / (infini-gram queries), POST /v1/completions, POST /v1/drafts, GET /health, \
                 GET /metrics",
                req.uri().path()
            ),
        },
    )
}

/// A known path with the wrong method.
async fn method_not_allowed(req: Request) -> Response {
    error_response(
        "other",
        &ApiError {
            status: 405,
            message: format!(
                "{} is not allowed on {}: queries and completions are POST requests with a JSON \
                 body; /health and /metrics are GET",
                req.method(),
                req.uri().path()
            ),
        },
    )
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        error_response("other", &self)
    }
}
