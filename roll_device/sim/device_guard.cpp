// The simulated NPU's device guard (roll_device/sim/device_guard.py builds and registers it).
//
// torch's Python-backend registration gives PrivateUse1 a guard with no streams or events, device 0
// as the current one, and a device count fixed at 1. This is that guard with the simulated machine's
// device count, which torch_npu's guard reports for the real machine: the autograd engine sizes its
// device queues by it at a process's first backward, and a backward on npu:1 stopped there.
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <atomic>

namespace {

using c10::Device;
using c10::DeviceIndex;
using c10::DeviceType;
using c10::Stream;

std::atomic<DeviceIndex> device_count{1};

struct SimNpuGuard final : public c10::impl::DeviceGuardImplInterface {
  DeviceType type() const override { return DeviceType::PrivateUse1; }
  Device exchangeDevice(Device) const override { return getDevice(); }
  Device getDevice() const override { return Device(type(), 0); }
  void setDevice(Device) const override {}
  void uncheckedSetDevice(Device) const noexcept override {}
  Stream getStream(Device) const noexcept override { return defaultStream(); }
  Stream getNewStream(Device, int) const override { return defaultStream(); }
  Stream exchangeStream(Stream) const noexcept override { return defaultStream(); }
  DeviceIndex deviceCount() const noexcept override { return device_count.load(); }
  void record(void**, const Stream&, const DeviceIndex, const c10::EventFlag) const override {}
  void block(void*, const Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const DeviceIndex) const noexcept override {}
  bool queryStream(const Stream&) const override { return true; }
  void synchronizeStream(const Stream&) const override {}

 private:
  Stream defaultStream() const { return Stream(Stream::DEFAULT, getDevice()); }
};

SimNpuGuard guard;

}  // namespace

// Make this PrivateUse1's guard, with `count` devices (replaces the one registered before).
extern "C" void roll_sim_register_guard(int count) {
  device_count.store(static_cast<DeviceIndex>(count));
  c10::impl::registerDeviceGuard(DeviceType::PrivateUse1, &guard);
}
