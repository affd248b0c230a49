// Values g * GROUP .. of input row x (a vec4 with zeros past GROUP).
fn x_group(at: u32) -> vec4<f32> {
    if (GROUP == 4u) {
        return vec4<f32>(act[at], act[at + 1u], act[at + 2u], act[at + 3u]);
    }
    return vec4<f32>(act[at], 0.0, 0.0, 0.0);
}
