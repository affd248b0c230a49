// Op::SelectRows: out[i, :] = x[select[i], :].
struct Params {
    x: u32,
    dst: u32,
    select: u32,
    cols: u32,
}
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> act: array<f32>;
@group(0) @binding(2) var<storage, read> args: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let c = gid.x;
    let i = wid.y;
    if (c >= p.cols) {
        return;
    }
    let src = args[p.select + i];
    act[p.dst + i * p.cols + c] = act[p.x + src * p.cols + c];
}
