// Shared by every shader (the build script puts `#version`, the kind's
// `KIND_*` define and `TILE` ahead of it). Buffers are reached by device
// address, passed in push constants: no descriptor sets, and no binding
// limit on a tensor's size.
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_shader_8bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require

layout(buffer_reference, std430, buffer_reference_align = 4) buffer F32 { float v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) buffer U32 { uint v[]; };
layout(buffer_reference, std430, buffer_reference_align = 1) buffer U8 { uint8_t v[]; };

// Every shader runs 64 invocations a workgroup.
layout(local_size_x = 64) in;

// Workgroups past 65535 in x wrap into y (the host splits the count).
uint group_index() {
    return gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
}

uint invocation_index() {
    return group_index() * 64u + gl_LocalInvocationID.x;
}

uint b8(U8 p, uint o) {
    return uint(p.v[o]);
}

int s8(U8 p, uint o) {
    return int(b8(p, o) << 24) >> 24;
}

float f16at(U8 p, uint o) {
    return unpackHalf2x16(b8(p, o) | (b8(p, o + 1u) << 8)).x;
}

// tanh without the overflow of its exponential form on large arguments.
float safe_tanh(float x) {
    return tanh(clamp(x, -15.0, 15.0));
}
