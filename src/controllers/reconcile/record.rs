//! Recording the events of a pass.

use kube::runtime::events::Event;
use tracing::{debug, info};

use super::Object;
use super::plan::Note;
use crate::controllers::Context;
use crate::controllers::workload::Workload;

/// Records an event; one that cannot be recorded never fails the pass. In
/// a namespace being deleted nothing can be: the event is logged instead,
/// once, and not tried.
pub async fn record<K: Workload>(ctx: &Context, obj: &K, o: &Object, note: &Note) {
    if o.namespace_terminating {
        info!(namespace = %o.namespace, name = %o.name, reason = note.reason, "not recorded (the namespace is being deleted): {}", note.note);
        return;
    }
    let event = Event {
        type_: note.type_,
        reason: note.reason.into(),
        note: Some(note.note.clone()),
        action: note.action.clone().unwrap_or_else(|| note.reason.into()),
        secondary: note.related.clone(),
    };
    let regarding = obj.object_ref(&());
    let published = match note.once {
        true => ctx.recorder.publish_once(&event, &regarding).await,
        false => ctx.recorder.publish(&event, &regarding).await,
    };
    if let Err(e) = published {
        debug!("recording event {}: {e}", note.reason);
    }
}
