//! The state reader against gzip decompression alone of the same bytes (the
//! floor) and against full parses with serde_json, on a 64 MiB decompressed
//! state with 20,000 resource instances.
//!
//! `cargo bench --bench state_reader` prints, for each way of reading, the
//! median wall-clock and CPU time (all threads) of several runs and their
//! ratios to the floor, the peak heap above what was live before the run (a
//! counting allocator), and the peak resident set of the whole process
//! (VmHWM). Each way runs in a process of its own, so that one's peak does
//! not hide another's. The reader inflates a state this large on a second
//! thread, so its wall time and its CPU time differ.
//!
//! Without `--bench` (as `cargo test --all-targets` runs it) it only checks,
//! on a small state, that every way reads the same thing.

use std::io::{Read, Write};
use std::process::Command;
use std::time::{Duration, Instant};

use captf_testkit::heap::{Counting, peak_during};
use flate2::Compression;
use flate2::bufread::MultiGzDecoder;
use flate2::write::GzEncoder;
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::json;

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const INSTANCES: usize = 20_000;
const PER_RESOURCE: usize = 10;
/// Just under the reader's 64 MiB cap.
const TARGET_BYTES: usize = 64 * 1024 * 1024 - 64 * 1024;
const RUNS: usize = 7;
const BLOCK: usize = 128 * 1024;

/// A small deterministic generator (xorshift64*), so every run reads the
/// same state.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn hex(&mut self, len: usize) -> String {
        (0..len)
            .map(|_| char::from(b"0123456789abcdef"[(self.next() % 16) as usize]))
            .collect()
    }

    fn base64(&mut self, len: usize) -> String {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        (0..len)
            .map(|_| char::from(ALPHABET[(self.next() % 64) as usize]))
            .collect()
    }
}

/// The attributes of one instance, shaped like a cloud VM's: ids, tags,
/// nested blocks, and some incompressible data, with `padding` bytes of
/// cloud-init text to reach the target size.
fn attributes(rng: &mut Rng, index: usize, padding: usize) -> serde_json::Value {
    let id = format!("i-{}", rng.hex(17));
    let volumes: Vec<_> = (0..1)
        .map(|v| {
            json!({
                "delete_on_termination": true,
                "device_name": format!("/dev/xvd{}", char::from(b'b' + v as u8)),
                "encrypted": v % 2 == 0,
                "iops": 3000,
                "kms_key_id": format!("arn:aws:kms:eu-west-1:123456789012:key/{}", rng.hex(32)),
                "snapshot_id": "",
                "tags": {"Name": format!("worker-{index}-vol-{v}"), "captf.io/managed-by": "captf"},
                "throughput": 125,
                "volume_id": format!("vol-{}", rng.hex(17)),
                "volume_size": 100 + v * 50,
                "volume_type": "gp3"
            })
        })
        .collect();
    let cloud_init: String = "#cloud-config\nwrite_files:\n  - path: /etc/kubernetes/kubelet.conf\n    content: |\n      apiVersion: kubelet.config.k8s.io/v1beta1\n"
        .chars()
        .cycle()
        .take(padding)
        .collect();
    json!({
        "ami": "ami-0c55b159cbfafe1f0",
        "arn": format!("arn:aws:ec2:eu-west-1:123456789012:instance/{id}"),
        "associate_public_ip_address": false,
        "availability_zone": format!("eu-west-1{}", ["a", "b", "c"][index % 3]),
        "disable_api_stop": false,
        "ebs_block_device": volumes,
        "ebs_optimized": true,
        "hibernation": null,
        "host_id": "",
        "iam_instance_profile": "captf-worker",
        "id": id,
        "instance_state": "running",
        "instance_type": "m6i.xlarge",
        "ipv6_addresses": [],
        "key_name": "",
        "metadata_options": [{
            "http_endpoint": "enabled",
            "http_put_response_hop_limit": 2,
            "http_tokens": "required",
            "instance_metadata_tags": "disabled"
        }],
        "monitoring": false,
        "network_interface": [],
        "primary_network_interface_id": format!("eni-{}", rng.hex(17)),
        "private_dns": format!("ip-10-0-{}-{}.eu-west-1.compute.internal", index / 250, index % 250),
        "private_ip": format!("10.0.{}.{}", index / 250, index % 250),
        "public_ip": "",
        "root_block_device": [{
            "delete_on_termination": true,
            "encrypted": true,
            "iops": 3000,
            "tags": {},
            "volume_id": format!("vol-{}", rng.hex(17)),
            "volume_size": 50,
            "volume_type": "gp3"
        }],
        "security_groups": [],
        "subnet_id": format!("subnet-{}", rng.hex(17)),
        "tags": {
            "Name": format!("worker-{index}"),
            "captf.io/cluster": "prod",
            "captf.io/kind": "TerraformMachine",
            "captf.io/managed-by": "captf",
            "captf.io/name": format!("worker-{index}"),
            "captf.io/namespace": "default"
        },
        "tenancy": "default",
        "user_data": rng.base64(40),
        "user_data_base64": cloud_init,
        "vpc_security_group_ids": [format!("sg-{}", rng.hex(17))]
    })
}

/// A version 4 state as OpenTofu writes it (two-space indentation), and its
/// expected managed resource count.
fn state(instances: usize, target: usize) -> (Vec<u8>, u64) {
    let build = |padding: usize| {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let resources: Vec<_> = (0..instances.div_ceil(PER_RESOURCE))
            .map(|r| {
                let count = PER_RESOURCE.min(instances - r * PER_RESOURCE);
                json!({
                    "module": "module.role",
                    "mode": "managed",
                    "type": "aws_instance",
                    "name": format!("worker_{r}"),
                    "provider": "provider[\"registry.opentofu.org/hashicorp/aws\"]",
                    "instances": (0..count).map(|i| json!({
                        "index_key": i,
                        "schema_version": 1,
                        "attributes": attributes(&mut rng, r * PER_RESOURCE + i, padding),
                        "sensitive_attributes": [[{"type": "get_attr", "value": "user_data"}]],
                        "private": rng.base64(64),
                        "dependencies": ["module.role.aws_security_group.workers", "module.role.aws_subnet.private"]
                    })).collect::<Vec<_>>()
                })
            })
            .chain(std::iter::once(json!({
                "mode": "data",
                "type": "aws_ami",
                "name": "base",
                "provider": "provider[\"registry.opentofu.org/hashicorp/aws\"]",
                "instances": [{"schema_version": 0, "attributes": {"id": "ami-0c55b159cbfafe1f0"}}]
            })))
            .collect();
        let document = json!({
            "version": 4,
            "terraform_version": "1.12.6",
            "serial": 4242,
            "lineage": "0f5d4a8e-3b7c-4d2e-9a1f-6c8b2e4d7f90",
            "outputs": {
                "endpoint": {"value": {"host": "10.0.0.1", "port": 6443}, "type": ["object", {"host": "string", "port": "number"}]},
                "token": {"value": "s3cr3t-token", "type": "string", "sensitive": true}
            },
            "resources": resources,
            "check_results": null
        });
        serde_json::to_vec_pretty(&document).unwrap_or_default()
    };
    let base = build(0);
    let padding = target.saturating_sub(base.len()) / instances.max(1);
    let json = build(padding);
    assert!(
        json.len() as u64 <= captf::state::MAX_DECOMPRESSED,
        "{} bytes",
        json.len()
    );
    (json, instances.div_ceil(PER_RESOURCE) as u64)
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut encoder = GzEncoder::new(Vec::new(), Compression::default());
    encoder.write_all(data).unwrap();
    encoder.finish().unwrap()
}

/// Inflates to nothing: the floor.
fn gunzip_only(compressed: &[u8]) -> u64 {
    let mut decoder = MultiGzDecoder::new(compressed);
    let mut block = vec![0; BLOCK];
    let mut total = 0;
    loop {
        match decoder.read(&mut block) {
            Ok(0) => return total,
            Ok(n) => total += n as u64,
            Err(error) => panic!("gunzip: {error}"),
        }
    }
}

fn gunzip_all(compressed: &[u8]) -> Vec<u8> {
    let mut json = Vec::new();
    MultiGzDecoder::new(compressed)
        .read_to_end(&mut json)
        .unwrap();
    json
}

/// The fields CAPTF reads, from a full serde_json Value.
fn summary_of_value(value: &serde_json::Value) -> (u64, u64, usize) {
    let managed = value["resources"]
        .as_array()
        .map(|resources| {
            resources
                .iter()
                .filter(|r| {
                    r["mode"] == "managed"
                        && r["instances"].as_array().is_some_and(|i| {
                            i.iter()
                                .any(|i| i["deposed"].as_str().unwrap_or("").is_empty())
                        })
                })
                .count() as u64
        })
        .unwrap_or(0);
    let outputs = value["outputs"].as_object().map_or(0, |o| o.len());
    (value["serial"].as_u64().unwrap_or(0), managed, outputs)
}

/// A typed serde struct that skips the instances' attributes.
#[derive(Deserialize)]
struct TypedState {
    serial: u64,
    outputs: std::collections::BTreeMap<String, IgnoredAny>,
    resources: Vec<TypedResource>,
}

#[derive(Deserialize)]
struct TypedResource {
    mode: String,
    instances: Vec<TypedInstance>,
}

#[derive(Deserialize)]
struct TypedInstance {
    #[serde(default)]
    deposed: Option<String>,
}

fn summary_of_typed(state: &TypedState) -> (u64, u64, usize) {
    let managed = state
        .resources
        .iter()
        .filter(|r| {
            r.mode == "managed"
                && r.instances
                    .iter()
                    .any(|i| i.deposed.as_deref().unwrap_or("").is_empty())
        })
        .count() as u64;
    (state.serial, managed, state.outputs.len())
}

/// Runs one way of reading and returns what it read.
fn run(way: &str, compressed: &[u8]) -> (u64, u64, usize) {
    match way {
        "gunzip" => (gunzip_only(compressed), 0, 0),
        "reader" => match captf::state::read_chunks(&[compressed]) {
            Ok(state) => (state.serial, state.managed_resources, state.outputs.len()),
            Err(why) => (0, 0, why.to_string().len()),
        },
        "value" => summary_of_value(&serde_json::from_slice(&gunzip_all(compressed)).unwrap()),
        "typed-slice" => {
            summary_of_typed(&serde_json::from_slice(&gunzip_all(compressed)).unwrap())
        }
        "typed-reader" => summary_of_typed(
            &serde_json::from_reader(std::io::BufReader::with_capacity(
                BLOCK,
                MultiGzDecoder::new(compressed),
            ))
            .unwrap(),
        ),
        other => panic!("unknown way {other}"),
    }
}

fn vm_hwm_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// CPU time of the whole process (every thread) so far.
fn cpu_time() -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut now) };
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

/// In a child process: runs `way` RUNS times over the file and prints
/// `wall_ns cpu_ns peak_heap_bytes vm_hwm_kib serial managed outputs`, the
/// times being medians.
fn child(way: &str, path: &str) {
    let compressed = std::fs::read(path).unwrap();
    let mut walls = Vec::with_capacity(RUNS);
    let mut cpus = Vec::with_capacity(RUNS);
    let mut peak = 0;
    let mut read = (0, 0, 0);
    for _ in 0..RUNS {
        let (start, cpu) = (Instant::now(), cpu_time());
        let (out, held) =
            peak_during(|| std::hint::black_box(run(way, std::hint::black_box(&compressed))));
        read = out;
        walls.push(start.elapsed());
        cpus.push(cpu_time() - cpu);
        peak = peak.max(held);
    }
    walls.sort();
    cpus.sort();
    println!(
        "{} {} {} {} {} {} {}",
        walls[RUNS / 2].as_nanos(),
        cpus[RUNS / 2].as_nanos(),
        peak,
        vm_hwm_kib(),
        read.0,
        read.1,
        read.2
    );
}

struct Figures {
    wall: Duration,
    cpu: Duration,
    peak_heap: u64,
    vm_hwm_kib: u64,
    read: String,
}

fn measure(way: &str, path: &std::path::Path) -> Figures {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--child", way])
        .arg(path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{way}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let fields: Vec<&str> = text.split_whitespace().collect();
    Figures {
        wall: Duration::from_nanos(fields[0].parse().unwrap()),
        cpu: Duration::from_nanos(fields[1].parse().unwrap()),
        peak_heap: fields[2].parse().unwrap(),
        vm_hwm_kib: fields[3].parse().unwrap(),
        read: fields[4..].join(" "),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--child") {
        child(&args[at + 1], &args[at + 2]);
        return;
    }
    // `--generate <path>` writes the benchmark's state, for a profiler's
    // `--child reader <path>`.
    if let Some(at) = args.iter().position(|a| a == "--generate") {
        std::fs::write(&args[at + 1], gzip(&state(INSTANCES, TARGET_BYTES).0)).unwrap();
        return;
    }
    if !args.iter().any(|a| a == "--bench") {
        smoke();
        return;
    }

    let started = Instant::now();
    let (json, managed) = state(INSTANCES, TARGET_BYTES);
    let compressed = gzip(&json);
    let dir = std::env::temp_dir().join(format!("captf-state-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("state.gz");
    std::fs::write(&path, &compressed).unwrap();
    let bomb_path = dir.join("bomb.gz");
    let bomb_bytes = captf_testkit::gzip_bomb(b"{\"version\": 4, \"a\": \"", b'x', 10 * 1024);
    std::fs::write(&bomb_path, &bomb_bytes).unwrap();
    println!(
        "state: {} bytes decompressed ({:.1} MiB), {} bytes compressed ({:.2} MiB, ratio {:.1}), {} instances in {} managed resources; generated in {:.1?}",
        json.len(),
        json.len() as f64 / 1048576.0,
        compressed.len(),
        compressed.len() as f64 / 1048576.0,
        json.len() as f64 / compressed.len() as f64,
        INSTANCES,
        managed,
        started.elapsed()
    );
    drop(json);

    let goal_kib = (2 * compressed.len() as u64 + 32 * 1024 * 1024) / 1024;
    println!(
        "medians of {RUNS} runs per way, each way in its own process; memory goal (2 x compressed + 32 MiB) = {goal_kib} KiB"
    );
    println!(
        "{:<13} {:>9} {:>8} {:>9} {:>8} {:>14} {:>10}   read (serial, managed, outputs)",
        "way", "wall", "x floor", "cpu", "x floor", "peak heap KiB", "VmHWM KiB"
    );
    let floor = measure("gunzip", &path);
    let mut reader = None;
    for way in ["gunzip", "reader", "typed-reader", "typed-slice", "value"] {
        let figures = if way == "gunzip" {
            &floor
        } else {
            &measure(way, &path)
        };
        println!(
            "{:<13} {:>9.1?} {:>8.2} {:>9.1?} {:>8.2} {:>14} {:>10}   {}",
            way,
            figures.wall,
            figures.wall.as_secs_f64() / floor.wall.as_secs_f64(),
            figures.cpu,
            figures.cpu.as_secs_f64() / floor.cpu.as_secs_f64(),
            figures.peak_heap / 1024,
            figures.vm_hwm_kib,
            if way == "gunzip" {
                format!(
                    "{} bytes inflated",
                    figures.read.split(' ').next().unwrap_or("")
                )
            } else {
                figures.read.clone()
            }
        );
        if way == "reader" {
            reader = Some((
                figures.wall.as_secs_f64() / floor.wall.as_secs_f64(),
                figures.cpu.as_secs_f64() / floor.cpu.as_secs_f64(),
                figures.peak_heap / 1024,
            ));
        }
    }
    let bomb_figures = measure("reader", &bomb_path);
    println!(
        "bomb: {} bytes of gzip inflating to 10 GiB: the reader stopped after {:.1?} (cpu {:.1?}), peak heap {} KiB, VmHWM {} KiB: {}",
        bomb_bytes.len(),
        bomb_figures.wall,
        bomb_figures.cpu,
        bomb_figures.peak_heap / 1024,
        bomb_figures.vm_hwm_kib,
        if bomb_figures.read.starts_with("0 0 ") {
            "refused"
        } else {
            "NOT refused"
        }
    );
    std::fs::remove_dir_all(&dir).ok();
    if let Some((wall, cpu, heap)) = reader {
        // The rows of `make bench`'s table.
        println!("| state reader | wall time ÷ gunzip alone | {wall:.2} | |");
        println!("| state reader | CPU time (all threads) ÷ gunzip alone | {cpu:.2} | |");
        println!("| state reader | peak heap | {heap} KiB | ≤ {goal_kib} KiB |");
    }
}

/// Every way reads the same thing from a small state.
fn smoke() {
    let (json, managed) = state(200, 1 << 20);
    let compressed = gzip(&json);
    let reader = run("reader", &compressed);
    assert_eq!(reader, (4242, managed, 2));
    for way in ["value", "typed-slice", "typed-reader"] {
        assert_eq!(run(way, &compressed), reader, "{way}");
    }
    assert_eq!(run("gunzip", &compressed).0, json.len() as u64);
    let prefix = b"{\"a\": \"";
    let whole = gunzip_all(&captf_testkit::gzip_bomb(prefix, b'x', 3));
    assert_eq!(
        whole.len(),
        prefix.len() + 3 * 1024 * 1024,
        "the bomb inflates as built"
    );
    assert!(whole.starts_with(prefix) && whole[prefix.len()..].iter().all(|&b| b == b'x'));
    let refused = captf::state::read_chunks(&[&captf_testkit::gzip_bomb(b" ", b' ', 100)]);
    assert_eq!(
        refused.map(|s| s.serial),
        Err(captf::state::Unreadable::Corrupt(
            captf::state::Corruption::TooLarge
        ))
    );
    println!(
        "state_reader smoke: every way read serial 4242, {managed} managed resources, 2 outputs"
    );
}
