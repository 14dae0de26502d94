//! Pod status: the containers' states and the pods/status a kubelet would
//! write for them.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};

use super::PodRun;

/// What a kubelet keeps of a termination message.
const MESSAGE_LIMIT: usize = 4096;

/// The state of one container, as its status shows it.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum State {
    Waiting {
        reason: String,
        message: Option<String>,
    },
    Running {
        started_at: Timestamp,
    },
    Terminated(Termination),
}

#[derive(Clone, Debug, PartialEq)]
pub(super) struct Termination {
    pub(super) exit_code: i32,
    pub(super) reason: String,
    pub(super) message: Option<String>,
    pub(super) signal: Option<i32>,
    pub(super) started_at: Timestamp,
    pub(super) finished_at: Timestamp,
}

pub(super) fn waiting(reason: &str, message: Option<String>) -> State {
    State::Waiting {
        reason: reason.to_string(),
        message,
    }
}

#[derive(Clone, Debug, PartialEq)]
pub(super) struct Slot {
    name: String,
    pub(super) image: String,
    /// What the kubelet reports once the image is pulled.
    pub(super) image_id: String,
    pub(super) state: State,
    /// The readiness probe's last answer; none without a probe (ready
    /// while running).
    pub(super) ready: Option<bool>,
    pub(super) restarts: i32,
    /// How its previous run ended.
    pub(super) last: Option<Termination>,
}

/// Every container's state, in the order of the pod's spec.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Statuses {
    pub(super) init: Vec<Slot>,
    pub(super) main: Vec<Slot>,
}

impl Statuses {
    pub(super) fn of(pod: &Pod) -> Statuses {
        let slots = |containers: &[Container], reason: &str| -> Vec<Slot> {
            containers
                .iter()
                .map(|c| Slot {
                    name: c.name.clone(),
                    image: c.image.clone().unwrap_or_default(),
                    image_id: String::new(),
                    state: waiting(reason, None),
                    ready: None,
                    restarts: 0,
                    last: None,
                })
                .collect()
        };
        let spec = pod.spec.clone().unwrap_or_default();
        let init = spec.init_containers.unwrap_or_default();
        let main_reason = if init.is_empty() {
            "ContainerCreating"
        } else {
            "PodInitializing"
        };
        Statuses {
            init: slots(&init, "PodInitializing"),
            main: slots(&spec.containers, main_reason),
        }
    }

    /// Every container waits for the same reason.
    pub(super) fn all_waiting(&mut self, reason: &str, message: &str) {
        for slot in self.init.iter_mut().chain(self.main.iter_mut()) {
            slot.state = waiting(reason, Some(message.to_string()));
        }
    }
}

/// The pod's phase from its containers' states: for restartPolicy Never,
/// and Running while a restarted container waits to run again.
fn phase(statuses: &Statuses) -> &'static str {
    let exit = |slot: &Slot| match &slot.state {
        State::Terminated(t) => Some(t.exit_code),
        _ => None,
    };
    if statuses
        .init
        .iter()
        .any(|s| exit(s).is_some_and(|code| code != 0))
    {
        return "Failed";
    }
    if statuses.init.iter().any(|s| exit(s).is_none()) {
        return "Pending";
    }
    if statuses.main.iter().any(|s| {
        matches!(s.state, State::Running { .. })
            || (s.restarts > 0 && !matches!(s.state, State::Terminated(_)))
    }) {
        return "Running";
    }
    let codes: Option<Vec<i32>> = statuses.main.iter().map(exit).collect();
    match codes {
        Some(codes) if !codes.is_empty() && codes.iter().all(|c| *c == 0) => "Succeeded",
        Some(codes) if !codes.is_empty() => "Failed",
        _ => "Pending",
    }
}

fn terminated(t: &Termination) -> ContainerState {
    ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code: t.exit_code,
            reason: Some(t.reason.clone()),
            message: t.message.clone(),
            signal: t.signal,
            started_at: Some(Time(t.started_at)),
            finished_at: Some(Time(t.finished_at)),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Whether a container is running and, if it has a probe, ready.
fn ready(slot: &Slot) -> bool {
    matches!(slot.state, State::Running { .. }) && slot.ready.unwrap_or(true)
}

/// The pods/status a kubelet would write for these states, with the pod's
/// IP when it has one of its own.
fn pod_status(
    statuses: &Statuses,
    start_time: Timestamp,
    now: Timestamp,
    pod_ip: Option<String>,
) -> PodStatus {
    let container = |slot: &Slot| {
        let state = match &slot.state {
            State::Waiting { reason, message } => ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some(reason.clone()),
                    message: message.clone(),
                }),
                ..Default::default()
            },
            State::Running { started_at } => ContainerState {
                running: Some(ContainerStateRunning {
                    started_at: Some(Time(*started_at)),
                }),
                ..Default::default()
            },
            State::Terminated(t) => terminated(t),
        };
        let running = matches!(slot.state, State::Running { .. });
        ContainerStatus {
            name: slot.name.clone(),
            image: slot.image.clone(),
            image_id: slot.image_id.clone(),
            ready: ready(slot),
            started: Some(running),
            restart_count: slot.restarts,
            state: Some(state),
            last_state: slot.last.as_ref().map(terminated),
            ..Default::default()
        }
    };
    let initialized = statuses
        .init
        .iter()
        .all(|s| matches!(&s.state, State::Terminated(t) if t.exit_code == 0));
    let ready = !statuses.main.is_empty() && statuses.main.iter().all(ready);
    let condition = |type_: &str, status: bool| PodCondition {
        type_: type_.to_string(),
        status: if status { "True" } else { "False" }.to_string(),
        last_transition_time: Some(Time(now)),
        ..Default::default()
    };
    PodStatus {
        phase: Some(phase(statuses).to_string()),
        start_time: Some(Time(start_time)),
        conditions: Some(vec![
            condition("PodScheduled", true),
            condition("Initialized", initialized),
            condition("ContainersReady", ready),
            condition("Ready", ready),
        ]),
        init_container_statuses: Some(statuses.init.iter().map(container).collect()),
        container_statuses: Some(statuses.main.iter().map(container).collect()),
        host_ip: pod_ip.as_ref().map(|_| "127.0.0.1".to_string()),
        pod_ips: pod_ip.as_ref().map(|ip| vec![PodIP { ip: ip.clone() }]),
        pod_ip,
        ..Default::default()
    }
}

/// How a container's process ended.
pub(super) fn termination(
    status: ExitStatus,
    oom_killed: bool,
    message: Option<String>,
    started_at: Timestamp,
    finished_at: Timestamp,
) -> Termination {
    let signal = status.signal();
    let exit_code = status.code().unwrap_or_else(|| 128 + signal.unwrap_or(0));
    let (exit_code, reason, message) = if oom_killed {
        // The OOM killer's SIGKILL; the process had no chance to write.
        (137, "OOMKilled", None)
    } else if exit_code == 0 {
        (0, "Completed", message)
    } else {
        (exit_code, "Error", message)
    };
    Termination {
        exit_code,
        reason: reason.to_string(),
        message,
        signal: if oom_killed {
            Some(libc::SIGKILL)
        } else {
            signal
        },
        started_at,
        finished_at,
    }
}

/// A termination message as a kubelet keeps it: at most 4096 bytes, cut on
/// a character boundary; none when empty.
pub(super) fn termination_message(bytes: &[u8]) -> Option<String> {
    let cut = &bytes[..bytes.len().min(MESSAGE_LIMIT)];
    let cut = match std::str::from_utf8(cut) {
        // A character split by the limit is dropped, not replaced.
        Err(e) if e.error_len().is_none() => &cut[..e.valid_up_to()],
        _ => cut,
    };
    let message = String::from_utf8_lossy(cut).into_owned();
    (!message.is_empty()).then_some(message)
}

impl PodRun {
    pub(super) async fn write_status(&mut self) {
        if self.written.as_ref() == Some(&self.statuses) {
            return;
        }
        let pod_ip = self.network.as_ref().map(|n| n.ip.to_string());
        let status = pod_status(&self.statuses, self.start_time, Timestamp::now(), pod_ip);
        let patch = Patch::Merge(serde_json::json!({ "status": status }));
        // As a kubelet does, keep trying while the API server is away (a
        // restart takes seconds): a pod whose end is never written holds
        // its Job active.
        let deadline = Instant::now() + Duration::from_secs(180);
        let mut pause = Duration::from_millis(200);
        while Instant::now() < deadline {
            match self
                .api
                .patch_status(&self.key.name, &PatchParams::default(), &patch)
                .await
            {
                Ok(_) => {
                    self.log(&format!("status: {}", phase(&self.statuses)));
                    self.written = Some(self.statuses.clone());
                    return;
                }
                Err(kube::Error::Api(status)) if status.code == 404 => return,
                Err(e) => {
                    self.log(&format!("writing the status: {e}"));
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(5));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(seconds).unwrap()
    }

    fn slot(name: &str, state: State) -> Slot {
        Slot {
            name: name.into(),
            image: "img".into(),
            image_id: String::new(),
            state,
            ready: None,
            restarts: 0,
            last: None,
        }
    }

    /// A container restarted once, after `done(1)`, now in `state`.
    fn restarted(state: State) -> Slot {
        let State::Terminated(last) = done(1) else {
            unreachable!()
        };
        Slot {
            restarts: 1,
            last: Some(last),
            ..slot("manager", state)
        }
    }

    fn done(exit_code: i32) -> State {
        State::Terminated(Termination {
            exit_code,
            reason: if exit_code == 0 { "Completed" } else { "Error" }.into(),
            message: None,
            signal: None,
            started_at: at(1),
            finished_at: at(2),
        })
    }

    fn running() -> State {
        State::Running { started_at: at(1) }
    }

    fn pending() -> State {
        waiting("PodInitializing", None)
    }

    #[test]
    fn the_phase_follows_the_containers() {
        let cases: Vec<(&str, Vec<State>, Vec<State>, &str)> = vec![
            (
                "nothing started",
                vec![pending()],
                vec![pending()],
                "Pending",
            ),
            ("init running", vec![running()], vec![pending()], "Pending"),
            ("init failed", vec![done(1)], vec![pending()], "Failed"),
            (
                "init done, main waiting",
                vec![done(0)],
                vec![pending()],
                "Pending",
            ),
            ("main running", vec![done(0)], vec![running()], "Running"),
            ("main succeeded", vec![done(0)], vec![done(0)], "Succeeded"),
            ("main failed", vec![done(0)], vec![done(137)], "Failed"),
            ("no init, main running", vec![], vec![running()], "Running"),
            (
                "no init, main succeeded",
                vec![],
                vec![done(0)],
                "Succeeded",
            ),
            ("no container", vec![], vec![], "Pending"),
        ];
        for (what, init, main, want) in cases {
            let statuses = Statuses {
                init: init.into_iter().map(|s| slot("runner", s)).collect(),
                main: main.into_iter().map(|s| slot("source", s)).collect(),
            };
            assert_eq!(phase(&statuses), want, "{what}");
        }
        let statuses = Statuses {
            init: vec![],
            main: vec![restarted(waiting("CrashLoopBackOff", None))],
        };
        assert_eq!(phase(&statuses), "Running", "restarting");
    }

    #[test]
    fn readiness_restarts_and_the_pod_ip_show_as_a_kubelets() {
        let unready = Slot {
            ready: Some(false),
            ..restarted(running())
        };
        let statuses = Statuses {
            init: vec![],
            main: vec![unready.clone()],
        };
        let ip = Some("198.18.0.2".to_string());
        let status = serde_json::to_value(pod_status(&statuses, at(0), at(5), ip)).unwrap();
        assert_eq!(status["podIP"], "198.18.0.2");
        assert_eq!(status["podIPs"][0]["ip"], "198.18.0.2");
        assert_eq!(status["hostIP"], "127.0.0.1");
        let main = &status["containerStatuses"][0];
        assert_eq!(main["ready"], false, "the probe said no");
        assert_eq!(main["restartCount"], 1);
        assert_eq!(main["lastState"]["terminated"]["exitCode"], 1);
        assert_eq!(status["conditions"][3]["status"], "False");

        let statuses = Statuses {
            init: vec![],
            main: vec![Slot {
                ready: Some(true),
                ..unready
            }],
        };
        let status = serde_json::to_value(pod_status(&statuses, at(0), at(5), None)).unwrap();
        assert_eq!(status["containerStatuses"][0]["ready"], true);
        assert_eq!(status["conditions"][3]["status"], "True");
        assert!(status.get("podIP").is_none());
    }

    #[test]
    fn the_pod_status_shows_each_container_state() {
        let statuses = Statuses {
            init: vec![slot("runner", done(0))],
            main: vec![slot("source", running())],
        };
        let status = serde_json::to_value(pod_status(&statuses, at(0), at(5), None)).unwrap();
        assert_eq!(status["phase"], "Running");
        assert_eq!(status["startTime"], "1970-01-01T00:00:00Z");
        let init = &status["initContainerStatuses"][0];
        assert_eq!(init["name"], "runner");
        assert_eq!(init["ready"], false);
        assert_eq!(init["state"]["terminated"]["exitCode"], 0);
        assert_eq!(init["state"]["terminated"]["reason"], "Completed");
        let main = &status["containerStatuses"][0];
        assert_eq!(main["name"], "source");
        assert_eq!(main["image"], "img");
        assert_eq!(main["ready"], true);
        assert_eq!(
            main["state"]["running"]["startedAt"],
            "1970-01-01T00:00:01Z"
        );
        let conditions: Vec<(String, String)> = status["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["type"].as_str().unwrap().into(),
                    c["status"].as_str().unwrap().into(),
                )
            })
            .collect();
        let want = [
            ("PodScheduled", "True"),
            ("Initialized", "True"),
            ("ContainersReady", "True"),
            ("Ready", "True"),
        ];
        assert_eq!(
            conditions,
            want.map(|(t, s)| (t.to_string(), s.to_string()))
        );

        let statuses = Statuses {
            init: vec![slot(
                "runner",
                waiting("ErrImagePull", Some("unknown".into())),
            )],
            main: vec![slot("source", pending())],
        };
        let status = serde_json::to_value(pod_status(&statuses, at(0), at(5), None)).unwrap();
        assert_eq!(status["phase"], "Pending");
        let waiting = &status["initContainerStatuses"][0]["state"]["waiting"];
        assert_eq!(
            (waiting["reason"].as_str(), waiting["message"].as_str()),
            (Some("ErrImagePull"), Some("unknown"))
        );
        assert_eq!(
            status["conditions"][1]["status"], "False",
            "not initialized"
        );
        assert_eq!(status["conditions"][3]["status"], "False", "not ready");
    }

    #[test]
    fn a_termination_says_how_the_process_ended() {
        struct Case {
            raw: i32,
            oom_killed: bool,
            exit_code: i32,
            reason: &'static str,
            message: Option<&'static str>,
            signal: Option<i32>,
        }
        let case = |raw, oom_killed, exit_code, reason, message, signal| Case {
            raw,
            oom_killed,
            exit_code,
            reason,
            message,
            signal,
        };
        let cases = [
            case(0, false, 0, "Completed", Some("result"), None),
            case(3 << 8, false, 3, "Error", Some("result"), None),
            case(
                libc::SIGTERM,
                false,
                143,
                "Error",
                Some("result"),
                Some(libc::SIGTERM),
            ),
            case(
                libc::SIGKILL,
                false,
                137,
                "Error",
                Some("result"),
                Some(libc::SIGKILL),
            ),
            case(
                libc::SIGKILL,
                true,
                137,
                "OOMKilled",
                None,
                Some(libc::SIGKILL),
            ),
        ];
        for c in cases {
            let t = termination(
                ExitStatus::from_raw(c.raw),
                c.oom_killed,
                Some("result".into()),
                at(1),
                at(2),
            );
            assert_eq!(
                (
                    t.exit_code,
                    t.reason.as_str(),
                    t.message.as_deref(),
                    t.signal
                ),
                (c.exit_code, c.reason, c.message, c.signal),
                "raw {}, OOM-killed {}",
                c.raw,
                c.oom_killed
            );
            assert_eq!((t.started_at, t.finished_at), (at(1), at(2)));
        }
    }

    #[test]
    fn a_termination_message_is_cut_at_4096_bytes_on_a_character() {
        let long = "a".repeat(5000);
        let split = format!("{}é", "a".repeat(4095));
        let cases: Vec<(&[u8], Option<String>)> = vec![
            (b"", None),
            (b"{\"ok\":true}", Some("{\"ok\":true}".into())),
            (long.as_bytes(), Some("a".repeat(4096))),
            (split.as_bytes(), Some("a".repeat(4095))),
            (b"a\xffb", Some("a\u{fffd}b".into())),
        ];
        for (bytes, want) in cases {
            assert_eq!(termination_message(bytes), want, "{} bytes", bytes.len());
        }
    }
}
