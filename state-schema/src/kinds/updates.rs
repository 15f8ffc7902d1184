//! `imageUpdates` (a Project's, or an Environment's with its own `image`): one of `semver` or
//! `pattern` (with `order`), `digests` and `branch`.

use super::*;
use crate::image_updates::{Branch, Digests, ImageUpdates, Order, Pick, invalid};

pub(crate) fn decode_image_updates(ctx: &mut Ctx<'_>, node: &Node<'_>) -> Option<ImageUpdates> {
    let what = "`imageUpdates`";
    let f = Fields::new(ctx, node, what, IMAGE_UPDATES_FIELDS)?;
    let text = |ctx: &mut Ctx<'_>, field: &str| {
        f.get(field).map(|n| {
            (
                n.pos,
                string(ctx, n, &format!("`imageUpdates.{field}`")).map(str::to_owned),
            )
        })
    };
    let (semver, pattern) = (text(ctx, "semver"), text(ctx, "pattern"));
    let order = f.get("order").map(|n| {
        one_of(
            ctx,
            n,
            "`imageUpdates.order`",
            &[("numeric", Order::Numeric), ("alphabetical", Order::Alphabetical)],
        )
    });
    let digests = f.get("digests").map_or(Some(Digests::Track), |n| {
        one_of(
            ctx,
            n,
            "`imageUpdates.digests`",
            &[("track", Digests::Track), ("pin", Digests::Pin)],
        )
    });
    let branch = f.get("branch").map_or(Some(Branch::Own), |n| {
        one_of(
            ctx,
            n,
            "`imageUpdates.branch`",
            &[("own", Branch::Own), ("applied", Branch::Applied)],
        )
    });
    let (pick, at) = match (semver, pattern) {
        (Some((pos, s)), None) => {
            if order.is_some() {
                ctx.error(
                    Code::FieldNotAllowed,
                    pos,
                    "`imageUpdates.order` goes with `pattern`, not `semver`",
                );
                return None;
            }
            (Pick::Semver { semver: s? }, pos)
        }
        (None, Some((pos, p))) => (
            Pick::Pattern {
                pattern: p?,
                order: present(order)?.unwrap_or(Order::Alphabetical),
            },
            pos,
        ),
        _ => {
            ctx.error_hint(
                Code::MissingField,
                node.pos,
                "`imageUpdates` needs exactly one of `semver` and `pattern`",
                "`semver: \">=1.4, <2\"`, or `pattern: \"^main-(?P<key>[0-9]+)$\"` with `order: numeric`",
            );
            return None;
        }
    };
    if let Some(why) = invalid(&pick) {
        ctx.error(Code::InvalidValue, at, why);
        return None;
    }
    Some(ImageUpdates {
        pick,
        digests: digests?,
        branch: branch?,
    })
}
