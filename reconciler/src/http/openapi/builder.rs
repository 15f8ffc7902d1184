//! The OpenAPI document's builder: a route's access, body, query parameters and answers as
//! utoipa's operations, each with the refusals every route shares.

use operator_proto as wire;
use utoipa::ToSchema;
use utoipa::openapi::path::{HttpMethod, OperationBuilder, ParameterBuilder, ParameterIn};
use utoipa::openapi::request_body::RequestBodyBuilder;
use utoipa::openapi::schema::{ComponentsBuilder, ObjectBuilder, Schema, Type};
use utoipa::openapi::security::SecurityRequirement;
use utoipa::openapi::{ContentBuilder, Ref, RefOr, Required, ResponseBuilder};

/// Who may call a route.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Access {
    /// No token: probes, the CA, enrolment (its one-time token is in the body).
    Anyone,
    /// A bearer token with at least this role.
    Token(&'static str),
    /// A forge's own signature.
    Forge,
}

/// The document as it is built.
pub(super) struct Doc {
    pub(super) routes: Vec<(String, HttpMethod, utoipa::openapi::path::Operation)>,
    pub(super) components: ComponentsBuilder,
}

/// What a route reads or answers.
pub(super) enum Body {
    Json(Box<RefOr<Schema>>),
    Text(&'static str),
    Opaque(&'static str),
    Empty,
}

pub(super) struct Query(
    pub(super) &'static str,
    pub(super) Type,
    pub(super) bool,
    pub(super) &'static str,
);

impl Doc {
    /// `T`'s schema as a reference, with it (and what it names) among the components.
    pub(super) fn json<T: ToSchema>(&mut self) -> Body {
        let mut named = Vec::new();
        T::schemas(&mut named);
        let mut c = std::mem::take(&mut self.components).schema_from::<T>();
        for (name, schema) in named {
            c = c.schema(name, schema);
        }
        self.components = c;
        Body::Json(Box::new(Ref::from_schema_name(T::name()).into()))
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn route(
        &mut self,
        method: HttpMethod,
        path: &str,
        access: Access,
        summary: &str,
        query: &[Query],
        request: Body,
        ok: (u16, Body),
    ) {
        let mut op = OperationBuilder::new()
            .operation_id(Some(operation_id(&method, path)))
            .summary(Some(summary))
            .tag(match path.strip_prefix("/v1/") {
                Some(rest) => rest.split('/').next().unwrap_or("daemon"),
                None => "daemon",
            });
        for segment in path.split('/').filter(|s| s.starts_with('{')) {
            let name = segment.trim_matches(['{', '}']);
            op = op.parameter(
                ParameterBuilder::new()
                    .name(name)
                    .parameter_in(ParameterIn::Path)
                    .required(Required::True)
                    .schema(Some(ObjectBuilder::new().schema_type(Type::String))),
            );
        }
        for Query(name, kind, required, about) in query {
            op = op.parameter(
                ParameterBuilder::new()
                    .name(*name)
                    .parameter_in(ParameterIn::Query)
                    .required(if *required { Required::True } else { Required::False })
                    .description(Some(*about))
                    .schema(Some(ObjectBuilder::new().schema_type(kind.clone()))),
            );
        }
        if let Some(content) = content(request) {
            op = op.request_body(Some(
                RequestBodyBuilder::new()
                    .content(content.0, content.1)
                    .required(Some(Required::True))
                    .build(),
            ));
        }
        let mut answer = ResponseBuilder::new().description(match ok.0 {
            202 => "asked for: follow the resource",
            _ => "the answer",
        });
        if let Some(c) = content(ok.1) {
            answer = answer.content(c.0, c.1);
        }
        op = op.response(ok.0.to_string(), answer.build());
        let Body::Json(error) = self.json::<wire::ErrorBody>() else {
            return;
        };
        let refusal = |what: &str| {
            ResponseBuilder::new()
                .description(what)
                .content(
                    "application/json",
                    ContentBuilder::new().schema(Some((*error).clone())).build(),
                )
                .build()
        };
        match access {
            Access::Token(role) => {
                op = op
                    .security(SecurityRequirement::new("token", [role]))
                    .response("401", refusal("no token, or not a token of this daemon (`bad-token`)"))
                    .response("403", refusal("the token's role may not (`insufficient-role`)"));
            }
            Access::Forge => {
                op = op
                    .response(
                        "401",
                        refusal("the forge's signature does not verify (`bad-signature`)"),
                    )
                    .response(
                        "404",
                        refusal("that forge is not configured (`webhook-not-configured`)"),
                    );
            }
            Access::Anyone => {}
        }
        if method == HttpMethod::Post {
            op = op.response(
                "400",
                refusal("the body is not what the route reads (`malformed-request`)"),
            );
        }
        op = op.response("default", refusal("any other refusal, with its stable code"));
        self.routes.push((path.to_owned(), method, op.build()));
    }
}

pub(super) fn content(body: Body) -> Option<(&'static str, utoipa::openapi::Content)> {
    let text = |about: &str| ObjectBuilder::new().schema_type(Type::String).description(Some(about));
    match body {
        Body::Json(schema) => Some(("application/json", ContentBuilder::new().schema(Some(*schema)).build())),
        Body::Text(about) => Some(("text/plain", ContentBuilder::new().schema(Some(text(about))).build())),
        Body::Opaque(about) => Some((
            "application/json",
            ContentBuilder::new()
                .schema(Some(ObjectBuilder::new().description(Some(about))))
                .build(),
        )),
        Body::Empty => None,
    }
}

/// `get_v1_nodes_node_token` and the like: unique, stable, readable in generated clients.
pub(super) fn operation_id(method: &HttpMethod, path: &str) -> String {
    let verb = match method {
        HttpMethod::Get => "get",
        HttpMethod::Post => "post",
        _ => "call",
    };
    let mut id = verb.to_owned();
    for part in path.split('/').filter(|p| !p.is_empty()) {
        id.push('_');
        id.extend(
            part.chars()
                .filter(|c| c.is_ascii_alphanumeric())
                .map(|c| c.to_ascii_lowercase()),
        );
    }
    id
}
