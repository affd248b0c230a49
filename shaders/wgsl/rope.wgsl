// Op::Rope (rotate-half): one invocation per (row, head, d < head_dim / 2). The inverse
// frequencies come from the host (the CPU reference's f32 formula), stored after the step
// arguments; the angle is reduced to [-pi, pi] before sin and cos.
struct Params {
    x: u32,
    dst: u32,
    positions: u32,
    inv_freq: u32,
    cols: u32,
    head_dim: u32,
    factor: f32,
}
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> act: array<f32>;
@group(0) @binding(2) var<storage, read> args: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let i = gid.x;
    let r = wid.y;
    let half_dim = p.head_dim / 2u;
    if (i >= p.cols / 2u) {
        return;
    }
    let head = i / half_dim;
    let d = i % half_dim;
    let pos = f32(args[p.positions + r]);
    let a = (pos / p.factor) * bitcast<f32>(args[p.inv_freq + d]);
    let k = round(a * 0.15915494);
    let red = (a - k * 6.28125) - k * 0.0019353072;
    let s = sin(red);
    let c = cos(red);
    let at = r * p.cols + head * p.head_dim + d;
    let x1 = act[p.x + at];
    let x2 = act[p.x + at + half_dim];
    act[p.dst + at] = x1 * c - x2 * s;
    act[p.dst + at + half_dim] = x2 * c + x1 * s;
}
