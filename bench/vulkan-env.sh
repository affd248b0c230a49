# bench/vulkan-env.sh: sourced by the device scripts (`. bench/vulkan-env.sh`) before they run
# anything on the GPU machine. Unpacks the Vulkan loader and GL dispatch packages carried in
# .gl/ (see the device tool's README) into / and refreshes the linker cache, then points the
# loader at the NVIDIA ICD and EGL vendor files where they exist and nothing else is set.
# Sets nothing else; on a machine without .gl/ or the NVIDIA files it changes nothing.
if compgen -G ".gl/*.deb" >/dev/null; then
    for f in .gl/*.deb; do dpkg -x "$f" /; done
    ldconfig
fi
if [ -z "${VK_DRIVER_FILES:-}" ] && [ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ]; then
    export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
fi
if [ -z "${__EGL_VENDOR_LIBRARY_FILENAMES:-}" ] && [ -f /usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json ]; then
    export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
fi
